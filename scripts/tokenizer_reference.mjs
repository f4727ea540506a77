// Produces tests/tokenizer/expected/<name>.json from the npm fixtures, using @lenml/tokenizers (a port of
// HF tokenizers + transformers.js apply_chat_template) as an independent oracle. Run after
// scripts/fetch_fixtures.sh:   node scripts/tokenizer_reference.mjs
// Known oracle divergences from HF are corrected in C++ tests, not here (see docs/tokenizers.md).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const npmDir = path.join(root, "tests/fixtures/npm");
const require = createRequire(path.join(npmDir, "package.json"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const { Template } = await import(require.resolve("@huggingface/jinja"));

// transformers passes the special tokens of tokenizer_config.json as strings to the template.
function tokenString(v) { return v && typeof v === "object" ? v.content : v; }

const corpus = fs.readFileSync(path.join(root, "tests/tokenizer/corpus.jsonl"), "utf8")
  .split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
const convs = JSON.parse(fs.readFileSync(path.join(root, "tests/tokenizer/conversations.json"), "utf8"));

// Known oracle divergences from Python Jinja (what transformers uses), corrected here and documented in
// docs/tokenizers.md: @huggingface/jinja 0.5.11 ignores the `chars` argument of str.strip/lstrip/rstrip and strips
// all whitespace, so Qwen 3's `content.lstrip('\n')` wrongly drops the leading spaces of "  Pourquoi ...".
const corrections = [
  { tokenizer: "qwen3", template: "default", conversation: 2, from: "</think>\n\nPourquoi", to: "</think>\n\n  Pourquoi",
    why: "@huggingface/jinja ignores the chars argument of lstrip; Python keeps the spaces" },
];

const names = process.argv.length > 2 ? process.argv.slice(2) : ["llama3", "qwen3", "gemma3", "llama2"];
for (const name of names) {
  const dir = path.join(npmDir, name, "models");
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const out = { tokenizer: name, oracle: "@lenml/tokenizers@3.7.2 + @huggingface/jinja@0.5.11", encode: [], chat: [] };
  // The oracle refuses to decode an empty id list; HF returns "".
  const decode = (ids, skip) =>
    ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
  for (const text of corpus) {
    const ids = tok.encode(text, { add_special_tokens: false });
    const idsSpecial = tok.encode(text, { add_special_tokens: true });
    out.encode.push({
      text, ids, ids_special: idsSpecial,
      decoded: decode(ids, false),
      decoded_skip: decode(idsSpecial, true),
    });
  }
  const templates = [];
  if (tokenizerConfig.chat_template) templates.push(["default", tokenizerConfig.chat_template]);
  if (name === "llama2") for (const [k, v] of Object.entries(convs.extra_templates)) templates.push([k, v]);
  for (const [tname, template] of templates) {
    convs.conversations.forEach((messages, ci) => {
      for (const gen of [false, true]) {
        let rendered = null, error = null;
        try {
          const vars = { messages, add_generation_prompt: gen };
          for (const k of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
            const v = tokenString(tokenizerConfig[k]);
            if (v) vars[k] = v;
          }
          rendered = new Template(template).render(vars);
        } catch (e) { error = String(e.message ?? e); }
        const entry = { template: tname, conversation: ci, add_generation_prompt: gen, rendered, error };
        for (const c of corrections) {
          if (c.tokenizer === name && c.template === tname && c.conversation === ci && rendered?.includes(c.from)) {
            entry.rendered = rendered.replace(c.from, c.to);
            entry.corrected = c.why;
          }
        }
        out.chat.push(entry);
      }
    });
  }
  const file = path.join(root, "tests/tokenizer/expected", `${name}.json`);
  fs.writeFileSync(file, JSON.stringify(out, null, 1) + "\n");
  console.log(`wrote ${file}`);
}
