// lmtune: one binary, CLI11 subcommands. Errors from lmtune become one message and a non-zero exit code.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "backend/vulkan/recorder.h"
#include "cli/commands.h"
#include "cli/ranks.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // Logs go to stderr so that stdout carries only results (--json output, generated text, tables).
  spdlog::set_default_logger(spdlog::stderr_color_mt("lmtune"));
  CLI::App app{"lmtune: fine-tune open LLMs on any GPU through Vulkan, or on the CPU"};
  app.require_subcommand(1);
  std::string device;
  app.add_option("--device", device, "cpu | vulkan | vulkan:N | auto (default: LMTUNE_DEVICE or auto)");
  app.fallthrough();  // global options may also follow the subcommand
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->each([](const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); });
  spdlog::set_pattern("[%H:%M:%S] [%^%l%$] %v");
  lmtune::cli::add_commands(app, device);
  lmtune::cli::set_command_line(argc, argv);  // --devices re-executes it under mpirun
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lmtune::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("internal error: {}", e.what());
    return 2;
  }
  // LMTUNE_PROFILE=1: GPU time per kernel of the whole command, on stderr.
  if (lmtune::vk::profiling() && !lmtune::vk::profile_stats().empty())
    std::fprintf(stderr, "\n%s", lmtune::vk::profile_report().c_str());
  return 0;
}
