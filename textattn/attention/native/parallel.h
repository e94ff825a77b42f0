// for_each_task: run body(worker, task) for task = 0 .. count-1 on up to `threads` workers.
//
// Two ways to run the workers (Workers::pool):
// - nullptr: std::threads started for the call, task t on worker t % threads.
// - XLA's intra-op thread pool (the FFI handler's Ctx<ThreadPool>, whose threads XLA:CPU
//   already runs its own parallel ops on): workers 1.. are scheduled there, the calling thread
//   is worker 0, and each worker claims the next unclaimed task until none are left, so a pool
//   thread busy elsewhere costs nothing (the caller takes its tasks) and no extra threads
//   compete for the cores.
// Either way a worker index is used by one thread at a time (callers keep per-worker scratch),
// and callers write each task's results to its own place, so results never depend on which
// worker ran a task. Exception-safe: if starting a thread fails, or a task throws (e.g.
// std::bad_alloc from a scratch buffer), the first exception is rethrown in the caller once no
// worker runs a task any more, which turns it into an XLA FFI error; an exception never
// reaches std::terminate.
#ifndef TEXTATTN_NATIVE_PARALLEL_H_
#define TEXTATTN_NATIVE_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace textattn {

struct Workers {
  Workers(int64_t threads, xla::ffi::ThreadPool* pool = nullptr)  // NOLINT: implicit from a count
      : threads(threads), pool(pool) {}
  // How many workers run `count` tasks (callers size per-worker scratch by it).
  int64_t for_tasks(int64_t count) const {
    return std::max<int64_t>(1, std::min<int64_t>(threads, count));
  }
  int64_t threads;             // at most this many workers
  xla::ffi::ThreadPool* pool;  // run them on XLA's pool (see above) if set
};

namespace internal {

// What the caller and its pool tasks share; pool tasks that start after the call returned
// find every task claimed and touch nothing else.
struct PoolRun {
  explicit PoolRun(int64_t count) : count(count) {}
  const int64_t count;
  std::atomic<int64_t> next{0};
  std::function<void(int64_t, int64_t)> body;  // only called for a claimed task
  std::mutex mutex;
  std::condition_variable idle;
  int64_t active = 0;  // workers inside work(); guarded by mutex
  std::exception_ptr error;
};

inline void work(const std::shared_ptr<PoolRun>& run, int64_t worker) {
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    ++run->active;  // before claiming, so the caller cannot see all claimed and none active
  }
  try {
    for (int64_t task = run->next.fetch_add(1); task < run->count;
         task = run->next.fetch_add(1))
      run->body(worker, task);
  } catch (...) {
    std::lock_guard<std::mutex> lock(run->mutex);
    if (!run->error) run->error = std::current_exception();
    run->next.store(run->count);  // nobody claims more
  }
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    --run->active;
  }
  run->idle.notify_all();
}

}  // namespace internal

template <typename Body>
void for_each_task(int64_t count, Workers workers, Body body) {
  const int64_t threads = workers.for_tasks(count);
  if (workers.pool != nullptr && threads > 1 && workers.pool->num_threads() > 0) {
    auto run = std::make_shared<internal::PoolRun>(count);
    run->body = [&body](int64_t worker, int64_t task) { body(worker, task); };
    try {
      for (int64_t worker = 1; worker < threads; ++worker)
        workers.pool->Schedule([run, worker] { internal::work(run, worker); });
    } catch (...) {  // (allocating a task failed: fewer workers, the same results)
    }
    internal::work(run, 0);  // the caller claims tasks too: it never waits for a busy pool
    std::unique_lock<std::mutex> lock(run->mutex);
    run->idle.wait(lock, [&] { return run->active == 0; });  // (every task is claimed here)
    if (run->error) std::rethrow_exception(run->error);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t worker) {
    try {
      for (int64_t task = worker; task < count; task += threads) body(worker, task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> started;
  try {
    for (int64_t worker = 1; worker < threads; ++worker) started.emplace_back(run, worker);
  } catch (...) {
    for (auto& thread : started) thread.join();
    throw;
  }
  run(0);
  for (auto& thread : started) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace textattn

#endif  // TEXTATTN_NATIVE_PARALLEL_H_
