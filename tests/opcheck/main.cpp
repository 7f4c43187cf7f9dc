// pooch-opcheck: checks every kernel of every backend against the reference
// kernels and every backward builder against finite differences. Plain argv
// parsing keeps the program free of dependencies beyond the runtime itself,
// so it runs on a GPU machine that has nothing but the CUDA libraries.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "runner.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: pooch-opcheck [options]\n"
               "  --op NAME          only this op and the backward ops derived from it\n"
               "  --backend B        cpu, cuda or all (default all); a backend asked for by\n"
               "                     name that is not available exits 77 (skipped)\n"
               "  --seed N           seed of the random cases (default fixed)\n"
               "  --threads N        kernel threads (default 2)\n"
               "  --arena-mib N      device arena and host pool size per backend (default 1024)\n"
               "  --verbose          print the worst element of passing checks too\n"
               "  --list             list the ops and each backend's kernel variants\n"
               "  --bench            time every variant of every checked op\n"
               "  --help             this text\n"
               "Exit status: 0 all passed, 1 a check failed, 2 usage error, 77 skipped.\n");
}

// Whole-string unsigned parse: "12x" or "" is an error, not 12 or 0.
bool parse_u64(const char* s, unsigned long long& out) {
  if (!s || !*s || *s == '-') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(s, &end, 10);
  return errno == 0 && end && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  pooch::opcheck::Options opt;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    // Flags that take a value accept both "--flag value" and "--flag=value".
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      if (std::strncmp(a, flag, n) == 0 && a[n] == '=') return a + n + 1;
      if (std::strcmp(a, flag) == 0) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "pooch-opcheck: %s needs a value\n", flag);
          std::exit(2);
        }
        return argv[++i];
      }
      return nullptr;
    };
    auto number = [&](const char* flag, const char* v, unsigned long long lo,
                      unsigned long long hi) -> unsigned long long {
      unsigned long long n = 0;
      if (!parse_u64(v, n) || n < lo || n > hi) {
        std::fprintf(stderr, "pooch-opcheck: %s wants a whole number in [%llu, %llu], got '%s'\n",
                     flag, lo, hi, v);
        std::exit(2);
      }
      return n;
    };
    const char* v = nullptr;
    if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (std::strcmp(a, "--verbose") == 0 || std::strcmp(a, "-v") == 0) {
      opt.verbose = true;
    } else if (std::strcmp(a, "--list") == 0) {
      opt.list = true;
    } else if (std::strcmp(a, "--bench") == 0) {
      opt.bench = true;
    } else if ((v = value("--op"))) {
      opt.op = v;
    } else if ((v = value("--backend"))) {
      opt.backend = v;
      if (opt.backend != "cpu" && opt.backend != "cuda" && opt.backend != "all") {
        std::fprintf(stderr, "pooch-opcheck: --backend wants cpu, cuda or all, got '%s'\n", v);
        return 2;
      }
    } else if ((v = value("--seed"))) {
      opt.seed = number("--seed", v, 0, ~0ull);
    } else if ((v = value("--threads"))) {
      opt.threads = static_cast<int>(number("--threads", v, 1, 1024));
    } else if ((v = value("--arena-mib"))) {
      opt.arena_mib = number("--arena-mib", v, 1, 1u << 20);
    } else {
      std::fprintf(stderr, "pooch-opcheck: unknown argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  try {
    return pooch::opcheck::run_opcheck(opt);
  } catch (const std::exception& e) {
    // Only set-up failures land here (a backend that cannot start, a case
    // generator that throws); every check catches its own errors.
    std::fprintf(stderr, "pooch-opcheck: %s\n", e.what());
    return 1;
  }
}
