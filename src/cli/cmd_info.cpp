// `lmtune info`: the compute devices lmtune found and the one it will use. Also the --device handling
// shared by every command.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "backend/vulkan/vulkan_backend.h"
#include "cli/commands.h"
#include "core/device.h"

namespace lmtune::cli {

void apply_device_option(const std::string& device) {
  if (!device.empty()) set_default_device(parse_device(device));
}

namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

void run_info(const std::string& device) {
  auto devices = vk::list_devices();
  std::printf("Vulkan devices:\n");
  if (devices.empty()) std::printf("  (none)\n");
  for (const auto& d : devices) {
    std::printf("  vulkan:%d  %s\n", d.index, d.name.c_str());
    std::printf("            type %s, memory %s, subgroup %u, fp16 %s, 16-bit storage %s, cooperative matrix %s\n",
                d.type.c_str(), gib(d.memory_bytes).c_str(), d.subgroup_size, d.fp16_arithmetic ? "yes" : "no",
                d.storage_16bit ? "yes" : "no", d.cooperative_matrix ? "yes" : "no");
    std::printf("            driver %s\n", d.driver.c_str());
  }
  std::printf("cpu       OpenBLAS, %s\n", "host memory");
  Device chosen = device.empty() ? choose_device() : parse_device(device);
  std::printf("using: %s%s\n", chosen.str().c_str(),
              device.empty() ? (std::getenv("LMTUNE_DEVICE") ? " (from LMTUNE_DEVICE)" : " (auto)") : " (from --device)");
}

}  // namespace

void add_info_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("info", "List compute devices and the one lmtune will use; with MODEL_DIR, "
                                         "describe the model and estimate LoRA training memory");
  auto model = std::make_shared<std::string>();
  auto opt = std::make_shared<ModelInfoOptions>();
  cmd->add_option("model", *model, "model directory (config.json + safetensors) or GGUF file")
      ->check(CLI::ExistingPath);
  cmd->add_option("--seq", opt->seq, "memory estimate: tokens per sequence")->default_val(2048);
  cmd->add_option("--batch", opt->batch, "memory estimate: sequences per step")->default_val(1);
  cmd->add_option("--rank", opt->rank, "memory estimate: LoRA rank")->default_val(16);
  cmd->add_option("--quantize", opt->quantize,
                  "memory estimate: the decoder layers' projections quantized (QLoRA): none | nf4 | q4_0 | q4_k | "
                  "q5_k | q6_k | q8_0")
      ->check(CLI::IsMember({"none", "nf4", "q4_0", "q4_k", "q5_k", "q6_k", "q8_0"}));
  cmd->callback([&device, model, opt] {
    if (model->empty())
      run_info(device);
    else
      print_model_info(*model, *opt);
  });
}

}  // namespace lmtune::cli
