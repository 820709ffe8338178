#include "megatron/parallel/watchdog.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/parallel/mpi_check.h"
#include "megatron/parallel/watchdog_report.h"

namespace megatron {

namespace {

constexpr int kQueryTag = 30001;  // MPI guarantees tags up to 32767
constexpr int kReplyTag = 30002;
constexpr int kReplyCapacity = 1 << 16;

// One write per block, so the lines of ranks that time out together do not interleave.
void print_block(const std::string& text) {
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

}  // namespace

Watchdog::Watchdog(MPI_Comm world, const WatchdogOptions& options) : options_(options), log_(options.log_capacity) {
  MEGATRON_CHECK(std::isfinite(options.timeout_seconds) && options.timeout_seconds > 0,
                 "distributed timeout " << options.timeout_seconds
                                        << " s must be positive; set --distributed-timeout-minutes above 0");
  MEGATRON_CHECK(options.poll_seconds > 0, "watchdog poll interval must be positive");
  if (world != MPI_COMM_NULL) {
    MPI_CHECK(MPI_Comm_rank(world, &world_rank_), "world");
    MPI_CHECK(MPI_Comm_dup(world, &side_), "watchdog");
    MPI_CHECK(MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN), "watchdog");
    post_query_receive();
  }
  thread_ = std::thread([this] { run(); });
}

// Teardown cannot report errors; MPI calls here are best effort.
Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (side_ == MPI_COMM_NULL) return;
  if (query_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&query_request_);
    MPI_Wait(&query_request_, MPI_STATUS_IGNORE);
  }
  for (auto& r : replies_)
    if (r->request != MPI_REQUEST_NULL) MPI_Request_free(&r->request);
  MPI_Comm_free(&side_);
}

uint64_t Watchdog::watch(const CollectiveRecord& record, double timeout_seconds, std::vector<int> peers,
                         std::function<bool()> done) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t token = next_token_++;
  watched_.push_back({token, record, log_.now() + timeout_seconds, timeout_seconds, std::move(peers), std::move(done)});
  return token;
}

void Watchdog::unwatch(uint64_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(watched_, [&](const Watched& w) { return w.token == token; });
}

void Watchdog::run() {
  try {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      if (side_ != MPI_COMM_NULL) serve_queries();
      lock.lock();
      const double now = log_.now();
      for (auto it = watched_.begin(); it != watched_.end();) {
        if (it->done && it->done()) {
          log_.end(it->record);
          it = watched_.erase(it);
        } else if (now > it->deadline) {
          const Watched w = *it;
          lock.unlock();
          fire(w);
        } else {
          ++it;
        }
      }
      wake_.wait_for(lock, std::chrono::duration<double>(options_.poll_seconds), [&] { return stop_; });
    }
  } catch (const std::exception& e) {
    print_block("[rank " + std::to_string(world_rank_) + "] watchdog failed: " + e.what() + "; aborting the job\n");
    if (side_ != MPI_COMM_NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
}

void Watchdog::post_query_receive() {
  MPI_CHECK(MPI_Irecv(&query_buffer_, 1, MPI_INT, MPI_ANY_SOURCE, kQueryTag, side_, &query_request_), "watchdog");
}

void Watchdog::serve_queries() {
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_CHECK(MPI_Test(&query_request_, &arrived, &status), "watchdog");
    if (!arrived) break;
    auto reply = std::make_unique<ReplySend>();
    reply->text = encode_status(world_rank_, log_, waits_on());
    reply->text.resize(std::min<size_t>(reply->text.size(), kReplyCapacity));
    // A querier that died makes this send fail; that is its problem, not this rank's.
    if (MPI_Isend(reply->text.data(), int(reply->text.size()), MPI_CHAR, status.MPI_SOURCE, kReplyTag, side_,
                  &reply->request) == MPI_SUCCESS)
      replies_.push_back(std::move(reply));
    post_query_receive();
  }
  for (auto& r : replies_) {
    int sent = 0;
    if (MPI_Test(&r->request, &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS) r->request = MPI_REQUEST_NULL;
  }
  std::erase_if(replies_, [](const auto& r) { return r->request == MPI_REQUEST_NULL; });
}

std::vector<int> Watchdog::waits_on() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> ranks;
  for (const Watched& w : watched_) ranks.insert(ranks.end(), w.peers.begin(), w.peers.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

// Errors are not thrown here: the job is already failing, and an unreachable peer is an answer.
std::vector<std::string> Watchdog::ask_peers(const std::vector<int>& peers, double window) {
  // Deliberately never freed: requests left pending may still write here until the abort.
  auto* buffers = new std::vector<std::vector<char>>(peers.size(), std::vector<char>(kReplyCapacity));
  std::vector<MPI_Request> receives(peers.size(), MPI_REQUEST_NULL);
  static int query = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    MPI_Irecv((*buffers)[i].data(), kReplyCapacity, MPI_CHAR, peers[i], kReplyTag, side_, &receives[i]);
    MPI_Request send = MPI_REQUEST_NULL;
    if (MPI_Isend(&query, 1, MPI_INT, peers[i], kQueryTag, side_, &send) == MPI_SUCCESS) MPI_Request_free(&send);
  }
  std::vector<std::string> texts(peers.size());
  const double deadline = log_.now() + window;
  size_t pending = peers.size();
  while (pending > 0 && log_.now() < deadline) {
    serve_queries();  // others that time out now ask this rank too
    for (size_t i = 0; i < peers.size(); ++i) {
      if (receives[i] == MPI_REQUEST_NULL) continue;
      int arrived = 0;
      MPI_Status status;
      if (MPI_Test(&receives[i], &arrived, &status) != MPI_SUCCESS) {
        receives[i] = MPI_REQUEST_NULL;
        --pending;
      } else if (arrived) {
        int length = 0;
        MPI_Get_count(&status, MPI_CHAR, &length);
        texts[i].assign((*buffers)[i].data(), size_t(std::max(length, 0)));
        --pending;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return texts;
}

void Watchdog::fire(const Watched& w) {
  const std::string me = "[rank " + std::to_string(world_rank_) + "] ";
  const double now = log_.now();
  std::ostringstream head;
  head << me << "error: " << record_name(w.record) << " did not complete within " << w.timeout
       << " s (--distributed-timeout-minutes " << w.timeout / 60 << ") on world rank " << world_rank_;
  if (!w.peers.empty()) head << "; asking ranks " << ranks_text(w.peers) << " for their state";
  head << "\n";
  const auto records = log_.recent(options_.print_records);
  head << me << "last " << records.size() << " communication records of this rank, oldest first:\n";
  for (const CollectiveRecord& r : records) head << me << "  " << format_record(r, now) << "\n";
  print_block(head.str());

  const double window = std::clamp(w.timeout / 2, 2.0, 30.0);
  double asked_at = log_.now();
  const auto ask = [&](const std::vector<int>& ranks) {
    std::vector<std::string> texts(ranks.size());
    if (side_ != MPI_COMM_NULL && !ranks.empty()) texts = ask_peers(ranks, window);
    asked_at = log_.now();
    std::vector<PeerStatus> statuses;
    for (size_t i = 0; i < ranks.size(); ++i) {
      PeerStatus s{ranks[i], false, {}, {}, {}};
      if (!texts[i].empty()) {
        try {
          s = decode_status(texts[i]);
        } catch (const Error& e) {
          print_block(me + "unreadable answer from rank " + std::to_string(ranks[i]) + ": " + e.what() + "\n");
        }
      }
      statuses.push_back(s);
    }
    return statuses;
  };
  const std::vector<PeerStatus> statuses = ask(w.peers);
  // Peers waiting elsewhere are followed to where their waits end; each round asks only ranks no
  // one asked before, so this ends within the world's size.
  std::vector<PeerStatus> followed;
  for (std::vector<int> next; !(next = ranks_to_follow(w.record, statuses, followed, world_rank_)).empty();) {
    const std::vector<PeerStatus> more = ask(next);
    followed.insert(followed.end(), more.begin(), more.end());
  }
  std::ostringstream tail;
  for (const std::string& line : diagnose(w.record, statuses, followed).lines) tail << me << line << "\n";
  tail << me << "aborting the job\n";
  print_block(tail.str());
  if (side_ != MPI_COMM_NULL) {
    // The launcher resumes stopped ranks as it ends the job (Open MPI's mpirun sends SIGCONT before
    // SIGTERM), and a rank stopped by SIGSTOP would then answer the queries of ranks still asking as
    // if it had been running, and be cleared by their diagnoses. So the abort waits two windows from
    // this rank's last question, answering the others meanwhile: ranks stuck about together have
    // all heard from the stopped rank's silence by then.
    while (log_.now() < asked_at + 2 * window) {
      serve_queries();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::_Exit(1);
}

}  // namespace megatron
