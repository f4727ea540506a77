// Prints a GGUF file's header as JSON, read by @huggingface/gguf (huggingface.js), an independent reader that the
// tests compare lmtune's reader and writer against (tests/io/gguf_oracle_test.cpp, tests/infer/gguf_export_test.cpp).
//   node tests/scripts/gguf_dump.mjs FILE.gguf
// Output: {"version", "tensor_data_offset", "metadata": {key: {"type", "sub_type"?, "value"}},
//          "tensors": [{"name", "type", "shape", "offset"}]}. 64-bit integers (BigInt) are printed as strings.
// Needs tests/fixtures/npm/node_modules/@huggingface/gguf (scripts/fetch_fixtures.sh).
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(path.join(root, "tests/fixtures/npm/package.json"));
const { gguf } = require("@huggingface/gguf");

const file = process.argv[2];
if (!file) {
  console.error("usage: node gguf_dump.mjs FILE.gguf");
  process.exit(2);
}
const out = await gguf(path.resolve(file), { allowLocalFile: true, typedMetadata: true });
const metadata = {};
for (const [key, entry] of Object.entries(out.typedMetadata)) {
  if (key === "version" || key === "tensor_count" || key === "kv_count") continue;
  metadata[key] = { type: entry.type, value: entry.value };
  if (entry.subType !== undefined) metadata[key].sub_type = entry.subType;
}
const result = {
  version: out.metadata.version,
  tensor_data_offset: out.tensorDataOffset,
  metadata,
  tensors: out.tensorInfos.map((t) => ({ name: t.name, type: t.dtype, shape: t.shape, offset: t.offset })),
};
process.stdout.write(JSON.stringify(result, (_, v) => (typeof v === "bigint" ? v.toString() : v)) + "\n");
