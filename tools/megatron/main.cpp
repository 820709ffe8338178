// The `megatron` executable: one subcommand per file in this directory.
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  std::puts("megatron: placeholder during bring-up");
  return 0;
}
