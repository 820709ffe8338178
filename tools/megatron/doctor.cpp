// megatron doctor: checks, before a long job, what it needs of the machine and the launch, and
// says in words what is wrong. Run it with the launcher and flags of the job (`srun --mpi=pmix
// megatron doctor --save DIR`, `mpirun -np N megatron doctor ...`); every rank checks:
//   launcher    which one started it, rank, world size and local rank (launchers MPI cannot join
//               are refused before this runs, naming the command that works);
//   MPI         the library MPI_Init joined;
//   device      the GPU of its local rank (name, compute capability, memory) or the CPU;
//   all-reduce  over every launched rank (NCCL on GPUs, MPI on CPUs): the sum is checked, and the
//               time of --all-reduce-mib MiB gives the bus bandwidth as nccl-tests defines it,
//               size / time x 2 (n - 1) / n;
//   --save      writable from every rank, one directory they all share (rank 0's file seen by the
//               others), and its free space.
// Rank 0 prints each finding once, with the ranks it holds for; the exit code is 1 when any check
// failed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "megatron/checkpointing/save_directory.h"
#include "megatron/core/error.h"
#include "megatron/core/strings.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/flags/flag_table.h"
#include "megatron/parallel/launch.h"
#include "megatron/parallel/parallel_state.h"
#include "megatron/parallel/text_collectives.h"
#include "megatron/training/device.h"

namespace megatron::tools {

namespace {
struct DoctorArgs {
  std::string save;
  std::string device = "auto";
  double all_reduce_mib = 64;
  int64_t iterations = 10;
  double timeout_minutes = 2;
};

std::vector<std::string> validate(const DoctorArgs& d) {
  std::vector<std::string> errors;
  if (!(d.all_reduce_mib > 0)) errors.push_back(concat("--all-reduce-mib ", d.all_reduce_mib, " must be positive"));
  if (d.iterations < 1) errors.push_back(concat("--iterations ", d.iterations, " must be >= 1"));
  if (!(d.timeout_minutes > 0))
    errors.push_back(concat("--distributed-timeout-minutes ", d.timeout_minutes, " must be positive"));
  return errors;
}

#define FIELD(member) MEGATRON_FLAG_FIELD(DoctorArgs, member)

const flags::FlagTable<DoctorArgs>& doctor_flags() {
  const char* checks = "checks";
  static const flags::FlagTable<DoctorArgs> table(
      "megatron doctor",
      "usage: [mpirun -np N | srun --mpi=pmix] megatron doctor [--save DIR] [flags]\n\n"
      "Checks the launch, MPI, each rank's device, an all-reduce over every rank (with its bus bandwidth)\n"
      "and the checkpoint directory, and says what is wrong in words; exit code 1 when a check fails.\n",
      {
          {"--save", FIELD(save), checks, "The checkpoint directory the job will use: writable, shared, free space"},
          {"--device", FIELD(device), checks, "Where the job computes", {"auto", "cpu", "cuda"}},
          {"--all-reduce-mib", FIELD(all_reduce_mib), checks, "Size of the timed all-reduce, in MiB"},
          {"--iterations", FIELD(iterations), checks, "Timed all-reduces (after one warm-up)"},
          {"--distributed-timeout-minutes", FIELD(timeout_minutes), checks,
           "A rank that does not join a collective within this is named"},
      },
      validate);
  return table;
}

#undef FIELD

struct Finding {
  bool ok;
  std::string text;
};

std::string hostname() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return host;
}

std::string format_number(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Sums (rank + 1) over the world in a buffer of --all-reduce-mib, checks every element of it, and
// times the rest.
Finding check_all_reduce(const DoctorArgs& d, Communicator& world, Device device) {
  const int n = world.size();
  const auto elements = int64_t(d.all_reduce_mib * 1024 * 1024 / 4);
  Tensor host = Tensor::empty({elements}, DType::f32);
  std::fill_n(host.data<float>(), elements, float(world.rank() + 1));
  Tensor buffer = device.is_cuda() ? host.to(device) : host.clone();
  world.all_reduce(buffer, ReduceOp::sum);
  const Tensor result = buffer.to(Device::cpu());
  const float expected = float(n) * float(n + 1) / 2;
  for (int64_t i = 0; i < elements; ++i)
    if (result.data<float>()[i] != expected)
      return {false, concat("all-reduce over ", n, " ranks (", world.name(), "): element ", i, " is ",
                            result.data<float>()[i], ", expected ", expected,
                            ": the collective library returns wrong sums; check the interconnect and its library")};
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < d.iterations; ++i) world.all_reduce(buffer, ReduceOp::sum);
  (void)buffer.item(0);  // the host waits for the device
  // The slowest rank's time: the collective is as fast as its last member.
  Tensor elapsed = Tensor::empty({1}, DType::f64);
  elapsed.set_item(0, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  Tensor slowest = elapsed.to(device);
  world.all_reduce(slowest, ReduceOp::max);
  const double seconds = slowest.item(0) / double(d.iterations);
  const double bytes = double(elements) * 4;
  const double bus_gbs = n > 1 ? bytes / seconds * 2.0 * (n - 1) / n / 1e9 : 0.0;
  const char* backend = n == 1 ? "one process" : device.is_cuda() ? "NCCL" : "MPI";
  return {true, concat("all-reduce of ", format_number(d.all_reduce_mib, "%g"), " MiB over ", n, " rank(s) (", backend,
                       "): correct, ", format_number(seconds * 1e3, "%.2f"), " ms, bus bandwidth ",
                       format_number(bus_gbs, "%.2f"), " GB/s")};
}

std::vector<Finding> check_save(const std::string& save, Communicator& world, Device device) {
  namespace fs = std::filesystem;
  bool writable = true;
  std::vector<Finding> out;
  try {
    checkpointing::prepare_save_directory(save, concat(".doctor_probe_rank_", world.rank()));
  } catch (const Error& e) {
    writable = false;
    out.push_back({false, e.what()});
  }
  // Rank 0's marker must be visible to every rank: one directory shared by all ("" when rank 0
  // could not write it, and then there is nothing to compare).
  std::string marker;
  if (world.rank() == 0 && writable) {
    marker = (fs::path(save) / concat(".doctor_shared_", getpid())).string();
    std::ofstream(marker) << "megatron doctor\n";
  }
  marker = broadcast_text(world, marker, 0, device);
  std::error_code ec;
  const bool shared = marker.empty() || fs::exists(marker, ec);
  if (!shared)
    out.push_back({false, concat("--save ", save, " is not the directory rank 0 sees (its file ", marker,
                                 " is missing here): checkpoints need one directory every rank shares, e.g. on a "
                                 "shared filesystem")});
  world.barrier();  // every rank has looked before rank 0 removes it
  if (world.rank() == 0 && !marker.empty()) fs::remove(marker, ec);
  const fs::space_info space = fs::space(save, ec);
  if (writable && shared && !ec)
    out.push_back({true, concat("--save ", save, ": writable, shared, ",
                                format_number(double(space.available) / double(1ull << 30), "%.1f"), " GiB free")});
  return out;
}

std::vector<Finding> run_checks(const DoctorArgs& d, const std::shared_ptr<MpiRuntime>& mpi) {
  const ProcessInfo process = mpi ? mpi->process() : ProcessInfo{};
  std::vector<Finding> found;
  found.push_back(
      {true, concat("launcher: ", launcher_name(process.launcher), ", rank ", process.rank, " of ", process.world_size,
                    ", local rank ", std::max(0, process.local_rank), ", host ", hostname())});
  if (mpi) found.push_back({true, "MPI: " + MpiRuntime::library_version()});
  Device device = Device::cpu();
  try {
    device = select_device(d.device, std::max(0, process.local_rank));
    if (device.is_cuda()) {
      const cuda::DeviceInfo gpu = cuda::init_device(device.index);
      found.push_back(
          {true, concat("GPU ", gpu.index, " of ", cuda::device_count(), " visible: ", gpu.name, " (sm_", gpu.sm_major,
                        gpu.sm_minor, ", ", format_number(double(gpu.total_memory) / double(1ull << 30), "%.1f"),
                        " GiB, ", gpu.multiprocessors, " SMs)")});
    } else {
      found.push_back({true, concat("device: CPU (", d.device == "cpu" ? "--device cpu" : "no GPU visible", ")")});
    }
  } catch (const Error& e) {
    found.push_back({false, concat("device: ", e.what())});
    device = Device::cpu();  // the checks over the world still run
  }
  ParallelSizes sizes;
  sizes.world = process.world_size;
  const ParallelState state =
      initialize_parallel(sizes, {.device = device, .timeout_seconds = 60.0 * d.timeout_minutes, .mpi = mpi});
  Communicator& world = *state.ctx.world;
  found.push_back(check_all_reduce(d, world, device));
  if (!d.save.empty())
    for (Finding& f : check_save(d.save, world, device)) found.push_back(std::move(f));

  // Rank 0 prints each finding once, with the ranks it holds for.
  nlohmann::json mine = nlohmann::json::array();
  for (const Finding& f : found) mine.push_back({f.ok, f.text});
  const std::vector<std::string> all = gather_text(world, mine.dump(), 0, device);
  std::vector<Finding> merged;
  if (world.rank() != 0) return merged;
  std::map<std::pair<bool, std::string>, std::vector<int>> ranks_of;
  std::vector<std::pair<bool, std::string>> order;
  for (size_t r = 0; r < all.size(); ++r)
    for (const auto& item : nlohmann::json::parse(all[r])) {
      const std::pair<bool, std::string> key{item[0].get<bool>(), item[1].get<std::string>()};
      if (!ranks_of.contains(key)) order.push_back(key);
      ranks_of[key].push_back(int(r));
    }
  for (const auto& key : order) {
    const std::vector<int>& ranks = ranks_of[key];
    std::string who = ranks.size() == all.size() && all.size() > 1 ? "all ranks" : "rank";
    if (who != "all ranks")
      for (size_t i = 0; i < ranks.size(); ++i) who += (i ? "," : " ") + std::to_string(ranks[i]);
    merged.push_back({key.first, concat(key.first ? "[ok]   " : "[FAIL] ", who, ": ", key.second)});
  }
  return merged;
}

int report(const std::vector<Finding>& findings) {
  bool failed = false;
  for (const Finding& f : findings) {
    std::printf("%s\n", f.text.c_str());
    failed = failed || !f.ok;
  }
  if (!findings.empty())
    std::printf(failed ? "megatron doctor: problems found\n" : "megatron doctor: all checks passed\n");
  std::fflush(stdout);
  return failed ? 1 : 0;
}
}  // namespace

std::string doctor_help() { return doctor_flags().help(); }

int doctor(const Args& args) {
  const DoctorArgs d = doctor_flags().parse(args);
  const ProcessInfo process = process_info_from_env();
  if (!process.launched()) return report(run_checks(d, nullptr));
  const auto mpi = std::make_shared<MpiRuntime>(process);
  int code = 0;
  try {
    code = report(run_checks(d, mpi));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatron doctor: error on rank %d: %s\n", mpi->process().rank, e.what());
    mpi->abort(1);
  }
  return code;  // rank 0's verdict (the others print nothing and return 0)
}

}  // namespace megatron::tools
