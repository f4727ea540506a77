// Build-time tool: turns a SPIR-V module's 16-bit float type into bfloat16 (SPV_KHR_bfloat16).
//
//   lmtune_spirv_bfloat16 IN.spv OUT.spv
//
// GLSL has no bfloat16 type in the shader compilers Debian ships (glslang 15 lacks GL_EXT_bfloat16), so the bf16
// kernels are written with float16_t and compiled, and this tool then gives the module's one `OpTypeFloat 16` the
// BFloat16KHR encoding and declares the capabilities BFloat16TypeKHR and BFloat16CooperativeMatrixKHR and the
// extension SPV_KHR_bfloat16. That is sound only where the 16-bit type is stored, loaded, converted and fed to
// cooperative-matrix products, never computed with: the tool refuses a module that does arithmetic on it.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kOpExtension = 10, kOpExtInstImport = 11, kOpExtInst = 12, kOpMemoryModel = 14,
                   kOpCapability = 17, kOpTypeFloat = 22, kOpTypeVector = 23;
constexpr uint32_t kCapBFloat16Type = 5116, kCapBFloat16CooperativeMatrix = 5118, kEncodingBFloat16 = 0;
// Instructions that compute with their operands (float arithmetic, extended instructions, dot products).
const std::set<uint32_t> kArithmetic = {kOpExtInst, 127, 129, 131, 133, 136, 140, 141, 142, 148};

int fail(const std::string& msg) {
  std::fprintf(stderr, "lmtune_spirv_bfloat16: %s\n", msg.c_str());
  return 1;
}

std::vector<uint32_t> string_words(const std::string& s) {
  std::vector<uint32_t> w((s.size() + 4) / 4, 0);
  for (size_t i = 0; i < s.size(); ++i) w[i / 4] |= uint32_t(uint8_t(s[i])) << (8 * (i % 4));
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: lmtune_spirv_bfloat16 IN.spv OUT.spv");
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return fail(std::string("cannot read ") + argv[1]);
  if (bytes.size() < 20 || bytes.size() % 4 != 0) return fail(std::string(argv[1]) + ": not a SPIR-V module");
  std::vector<uint32_t> w(bytes.size() / 4);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(w.data()));
  if (w[0] != 0x07230203u) return fail(std::string(argv[1]) + ": not a SPIR-V module (magic)");

  // The 16-bit float type, and the vectors of it (whose arithmetic is refused too).
  std::set<uint32_t> half_types;
  for (size_t i = 5; i < w.size();) {
    const uint32_t count = w[i] >> 16, op = w[i] & 0xffff;
    if (count == 0 || i + count > w.size()) return fail(std::string(argv[1]) + ": truncated instruction");
    if (op == kOpTypeFloat && count == 3 && w[i + 2] == 16) half_types.insert(w[i + 1]);
    if (op == kOpTypeVector && half_types.count(w[i + 2])) half_types.insert(w[i + 1]);
    if (kArithmetic.count(op) && count > 1 && half_types.count(w[i + 1]))
      return fail(std::string(argv[1]) + ": computes with the 16-bit float type (opcode " + std::to_string(op) +
                  "); only loads, stores, conversions and cooperative-matrix products may use it");
    i += count;
  }
  if (half_types.empty()) return fail(std::string(argv[1]) + ": has no 16-bit float type to turn into bfloat16");

  std::vector<uint32_t> out(w.begin(), w.begin() + 5);
  bool caps_added = false, ext_added = false;
  for (size_t i = 5; i < w.size();) {
    const uint32_t count = w[i] >> 16, op = w[i] & 0xffff;
    if (op == kOpCapability && !caps_added) {
      out.insert(out.end(), {(2u << 16) | kOpCapability, kCapBFloat16Type, (2u << 16) | kOpCapability,
                             kCapBFloat16CooperativeMatrix});
      caps_added = true;
    }
    // Extensions come after every capability: before the first extension, import or the memory model.
    if (!ext_added && (op == kOpExtension || op == kOpExtInstImport || op == kOpMemoryModel)) {
      std::vector<uint32_t> name = string_words("SPV_KHR_bfloat16");
      out.push_back(uint32_t(1 + name.size()) << 16 | kOpExtension);
      out.insert(out.end(), name.begin(), name.end());
      ext_added = true;
    }
    if (op == kOpTypeFloat && count == 3 && w[i + 2] == 16)
      out.insert(out.end(), {(4u << 16) | kOpTypeFloat, w[i + 1], 16, kEncodingBFloat16});
    else
      out.insert(out.end(), w.begin() + long(i), w.begin() + long(i + count));
    i += count;
  }
  if (!caps_added || !ext_added) return fail(std::string(argv[1]) + ": no capability or memory model section");
  std::ofstream o(argv[2], std::ios::binary);
  o.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * 4));
  if (!o) return fail(std::string("cannot write ") + argv[2]);
  return 0;
}
