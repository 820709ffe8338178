#pragma once
// The watchdog: turns a stuck communication into an error that names the rank that never
// arrived, within the timeout (--distributed-timeout-minutes), instead of a silent hang.
//
// Design.
//  - Every operation is recorded in the rank's CollectiveLog (group, seq, op, count, dtype,
//    start) when issued. While someone waits for it, it is *watched* with a deadline: a host
//    wait (MPI) is watched for the duration of the wait; a GPU operation (NCCL) from its issue
//    until its completion event fires, which the watchdog thread polls.
//  - One thread per process checks the deadlines every poll interval. When one passes, that rank
//    prints its last log records to stderr at once, then asks the other ranks of the stuck
//    group (or the peers of a stuck point-to-point batch) for their status over a *side
//    channel*: its own duplicate of MPI_COMM_WORLD, used only with MPI_Isend/MPI_Irecv/MPI_Test
//    and a reply window of half the timeout (2 to 30 s), so asking cannot hang.
//  - Every rank's watchdog thread keeps a receive posted on the side channel and answers a query
//    within one poll interval with its progress per group and its operations in flight
//    (watchdog_report.h), whatever its main thread is doing: waiting, computing, or stuck in
//    another group. A rank that does not answer is stopped or dead.
//  - Answers name the ranks the answering rank's watched operations wait on. A peer that waits
//    elsewhere (behind, inside another operation) is followed: the ranks it waits on are asked in
//    turn, until the chains end at ranks that are silent or have nothing in flight.
//  - The timed-out rank prints the diagnosis (each peer's state and "missing rank(s): ...": the
//    peers that did not answer, had not issued the operation, or issued a different one, and the
//    ends of the chains that hold the others), then
//    aborts the job with MPI_Abort: a rank that gave up on a collective cannot take part in
//    collectives again, and MPI_Finalize could wait for the missing rank forever. The abort comes
//    two reply windows after its last question: ending the job resumes stopped ranks (mpirun's SIGCONT
//    before SIGTERM), which would otherwise answer the ranks still asking as if they had run.
// Ranks that time out together each print their own record before the first abort ends the
// job, so the log shows which rank never arrived at which operation.
//
// Without MPI (a single process driving NCCL in tests) the side channel is absent: a timeout
// prints the log and ends the process.
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "megatron/parallel/collective_log.h"

namespace megatron {

struct WatchdogOptions {
  double timeout_seconds = 600;  // Megatron's --distributed-timeout-minutes default: 10
  size_t log_capacity = 64;      // records kept in the ring
  size_t print_records = 16;     // records printed on a timeout
  double poll_seconds = 0.02;    // deadline checks and query answers
};

class Watchdog {
 public:
  // world: duplicated for the side channel (collective over it); MPI_COMM_NULL without MPI.
  Watchdog(MPI_Comm world, const WatchdogOptions& options);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  CollectiveLog& log() { return log_; }
  double default_timeout() const { return options_.timeout_seconds; }
  int world_rank() const { return world_rank_; }

  // Watches `record` until `timeout_seconds` from now. `peers` (world ranks) are asked for their
  // status on a timeout. With `done`, the watchdog thread polls it and, once it returns true,
  // ends the record in the log and stops watching (GPU work); without, the waiter calls unwatch().
  uint64_t watch(const CollectiveRecord& record, double timeout_seconds, std::vector<int> peers,
                 std::function<bool()> done = {});
  void unwatch(uint64_t token);

  // Watches a host wait for its lifetime.
  class Scope {
   public:
    Scope(Watchdog& watchdog, const CollectiveRecord& record, double timeout_seconds, std::vector<int> peers)
        : watchdog_(watchdog), token_(watchdog.watch(record, timeout_seconds, std::move(peers))) {}
    ~Scope() { watchdog_.unwatch(token_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Watchdog& watchdog_;
    uint64_t token_;
  };

 private:
  struct Watched {
    uint64_t token = 0;
    CollectiveRecord record;
    double deadline = 0;
    double timeout = 0;
    std::vector<int> peers;
    std::function<bool()> done;
  };
  struct ReplySend {
    std::string text;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  void run();
  void serve_queries();
  void post_query_receive();
  // Prints the report for `w` and ends the job.
  [[noreturn]] void fire(const Watched& w);
  std::vector<std::string> ask_peers(const std::vector<int>& peers, double window);
  // The world ranks the watched operations wait on, for this rank's answers.
  std::vector<int> waits_on();

  WatchdogOptions options_;
  CollectiveLog log_;
  int world_rank_ = 0;
  MPI_Comm side_ = MPI_COMM_NULL;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Watched> watched_;
  uint64_t next_token_ = 1;
  bool stop_ = false;

  // Used by the watchdog thread only.
  MPI_Request query_request_ = MPI_REQUEST_NULL;
  int query_buffer_ = 0;
  std::vector<std::unique_ptr<ReplySend>> replies_;

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace megatron
