// Where the host's time goes on a machine without perf (the GPU machine): an LD_PRELOAD library that samples the
// main thread's stack every millisecond of the process's CPU time (SIGPROF) and writes the stacks and the memory
// map to $HOST_SAMPLER_OUT.<pid> at exit. bench/host_sampler_report.py names the frames against the same binary.
//   gcc -O2 -shared -fPIC -o host_sampler.so bench/host_sampler.c
//   HOST_SAMPLER_OUT=/tmp/s LD_PRELOAD=$PWD/host_sampler.so lmtune --device vulkan bench train ...
//   python3 bench/host_sampler_report.py /tmp/s.<pid> path/to/lmtune [FUNCTION]
// Only the main thread's samples are kept (it records the GPU's work); the rest are counted.
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

enum { kMaxSamples = 400000, kDepth = 28 };
static void* stacks[kMaxSamples][kDepth];
static int depths[kMaxSamples];
static volatile int taken, elsewhere;
static pid_t main_tid;

static void on_tick(int sig, siginfo_t* info, void* context) {
  (void)sig, (void)info, (void)context;
  if ((pid_t)syscall(SYS_gettid) != main_tid) {
    __sync_fetch_and_add(&elsewhere, 1);
    return;
  }
  int i = __sync_fetch_and_add(&taken, 1);
  if (i < kMaxSamples) depths[i] = backtrace(stacks[i], kDepth);
}

__attribute__((constructor)) static void start(void) {
  if (!getenv("HOST_SAMPLER_OUT")) return;
  main_tid = getpid();
  void* warm[2];
  backtrace(warm, 2);  // loads the unwinder now, not inside the signal handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_tick;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigaction(SIGPROF, &sa, 0);
  struct itimerval every_ms = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_PROF, &every_ms, 0);
}

__attribute__((destructor)) static void stop(void) {
  const char* prefix = getenv("HOST_SAMPLER_OUT");
  if (!prefix) return;
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, 0);
  char path[512];
  snprintf(path, sizeof path, "%s.%d", prefix, (int)getpid());
  FILE* out = fopen(path, "w");
  if (!out) return;
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[1024];
  while (maps && fgets(line, sizeof line, maps)) fprintf(out, "M %s", line);
  if (maps) fclose(maps);
  fprintf(out, "O %d\n", elsewhere);
  int n = taken < kMaxSamples ? taken : kMaxSamples;
  for (int i = 0; i < n; ++i) {
    fputc('S', out);
    for (int d = 1; d < depths[i]; ++d) fprintf(out, " %lx", (unsigned long)stacks[i][d]);  // 0: the handler
    fputc('\n', out);
  }
  fclose(out);
}
