// The C++ adapter (class in adapter.h): statistics, cacheInfo, emptyCache,
// private pools and checkpoints; the allocator object and
// nf_adapter_install(), which nofrag.torch.enable() calls through ctypes.
#include "adapter.h"

#include <execinfo.h>
#include <signal.h>

namespace nfa {

void NofragAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "nofrag: memory fraction ", fraction, " out of range 0..1");
  nf_torch_set_fraction(fraction, device);
  if (nf_torch_last_status() != NF_OK) throw_error(std::string("nofrag: set_per_process_memory_fraction: ") + nf_torch_last_error());
}

cda::DeviceStats NofragAllocator::getDeviceStats(c10::DeviceIndex device) {
  cda::DeviceStats out;
  nf_stats_t s;
  uint64_t c[6] = {0, 0, 0, 0, 0, 0};
  if (nf_torch_stats(device, &s) != 0) return out;
  nf_torch_counters(device, c, 6);
  std::lock_guard<std::mutex> g(stats_mu_);
  Base& b = base_[device];
  auto acc = [](uint64_t v, uint64_t base) { return (int64_t)(v > base ? v - base : 0); };
  uint64_t gr = s.granule ? s.granule : 1;
  auto set = [](c10::CachingAllocator::StatArray& a, uint64_t cur, uint64_t peak, int64_t al, int64_t fr) {
    for (size_t t : {(size_t)c10::CachingAllocator::StatType::AGGREGATE,
                     (size_t)c10::CachingAllocator::StatType::LARGE_POOL}) {
      a[t].current = (int64_t)cur;
      a[t].peak = (int64_t)peak;
      a[t].allocated = al;
      a[t].freed = fr;
    }
  };
  // The mapping of docs/pytorch.md ("memory_stats"), as the ctypes path had it.
  set(out.allocated_bytes, s.live_rounded, s.live_rounded_peak, acc(c[0], b.bytes_alloc), acc(c[1], b.bytes_freed));
  set(out.requested_bytes, s.live, s.live_peak, acc(c[0], b.bytes_alloc), acc(c[1], b.bytes_freed));
  set(out.active_bytes, s.live_rounded, s.live_rounded_peak, acc(c[0], b.bytes_alloc), acc(c[1], b.bytes_freed));
  // Granules, not driver calls: a unit is one call for many granules, and
  // host (spill) granules are not device memory.
  set(out.reserved_bytes, s.physical, s.physical_peak, acc(s.physical_created, b.create),
      acc(s.physical_released, b.release));
  set(out.inactive_split_bytes, s.cached, s.cached, 0, 0);
  set(out.allocation, s.live_blocks, s.live_blocks, acc(s.allocs, b.allocs), acc(s.frees, b.frees));
  set(out.active, s.live_blocks, s.live_blocks, acc(s.allocs, b.allocs), acc(s.frees, b.frees));
  set(out.segment, s.physical / gr, s.physical_peak / gr, acc(s.physical_created, b.create) / (int64_t)gr,
      acc(s.physical_released, b.release) / (int64_t)gr);
  out.num_alloc_retries = acc(s.reclaims, b.reclaims);
  out.num_ooms = acc(s.ooms + c[5], b.ooms); // c[5]: refused by the memory fraction, as PyTorch counts them
  out.num_sync_all_streams = acc(s.calls.event_sync, b.event_sync);
  out.num_device_alloc = acc(s.calls.map, b.map);
  out.num_device_free = acc(s.calls.unmap, b.unmap);
  out.max_split_size = -1;
  return out;
}

void NofragAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  nf_stats_t s;
  uint64_t c[6] = {0, 0, 0, 0, 0, 0};
  if (nf_torch_stats(device, &s) != 0) return;
  nf_torch_counters(device, c, 6);
  std::lock_guard<std::mutex> g(stats_mu_);
  base_[device] = Base{c[0], c[1], s.allocs, s.frees, s.physical_created, s.physical_released, s.reclaims,
                       s.ooms + c[5], s.calls.event_sync, s.calls.map, s.calls.unmap};
}

void NofragAllocator::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  if (!largestBlock) return;
  // cuDNN asks before this device's first allocation too: make the pool (its
  // limit bounds the answer); if it cannot be made, leave the guess as given.
  if (!nf_torch_pool_get(device, 1)) return;
  nf_stats_t s;
  if (nf_torch_stats(device, &s) != 0) return;
  size_t best = *largestBlock;
  if (best == 0) {
    size_t dfree = 0, dtotal = 0;
    if (cudaMemGetInfo(&dfree, &dtotal) != cudaSuccess) (void)cudaGetLastError();
    uint64_t room = s.limit > s.physical ? s.limit - s.physical : 0;
    best = (size_t)std::min<uint64_t>(room, dfree) + (size_t)(s.physical - std::min(s.physical, s.mapped));
  }
  *largestBlock = std::max<size_t>(best, (size_t)s.largest_free_mapped);
}

void NofragAllocator::emptyCache(MempoolId_t mempool_id) {
  if (mempool_id.first == 0 && mempool_id.second == 0) {
    if (captures_.load() != 0) return; // PyTorch's allocator does not release during a capture either
    nf_torch_reset();
    return;
  }
  // One pool: nothing to do. PyTorch's allocator frees a pool's blocks here
  // only once its use count is 0, and release_now has trimmed and handed
  // back such a pool already. While a user remains -- a CUDA graph captured
  // into a MemPool outlives it: ~MemPool calls releasePool, then this --
  // the pool's free ranges are addresses its graph replays write to, and
  // unmapping them would fault the next replay.
}

void NofragAllocator::beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id, std::function<bool(cudaStream_t)> filter) {
  nf_pool_t* p = pool(device);
  std::lock_guard<std::mutex> rel(release_mu_); // a release's device wait ends before a capture begins (release_now)
  std::lock_guard<std::mutex> g(routes_mu_);
  // Per device, as PyTorch's allocator keeps its routes per device: one
  // MemPool may be routed to on two devices at once (each has its own pool).
  for (const Route& r : routes_)
    TORCH_CHECK(r.id != mempool_id || r.device != device, "nofrag: beginAllocateToPool: already allocating to pool (",
                mempool_id.first, ", ", mempool_id.second, ") on device ", (int)device);
  uint64_t key = key_of(mempool_id);
  check(nf_private_incref(p, key), "beginAllocateToPool");
  Route r{mempool_id, key, device, std::move(filter), false, {}};
  cudaStream_t cur = c10::cuda::getCurrentCUDAStream(device).stream();
  if (is_capturing(cur) || !r.filter(cur)) { // a capture (see the header comment)
    if (nf_private_begin(p, key, (nf_stream_t)cur) != NF_OK) {
      std::string why = lib_error();
      nf_private_release(p, key); // the use taken above
      throw_error("nofrag: beginAllocateToPool: " + why);
    }
    r.capture = true;
    r.streams.push_back(cur);
    captures_.fetch_add(1);
  }
  routes_.push_back(std::move(r));
  nroutes_.fetch_add(1, std::memory_order_release);
}

void NofragAllocator::endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  std::vector<std::pair<c10::DeviceIndex, uint64_t>> release;
  std::vector<std::pair<c10::DeviceIndex, nf_ipc_map_t*>> close;
  {
    std::lock_guard<std::mutex> g(routes_mu_);
    auto it = std::find_if(routes_.rbegin(), routes_.rend(),
                           [&](const Route& r) { return r.id == mempool_id && r.device == device; });
    TORCH_CHECK(it != routes_.rend(), "nofrag: endAllocateToPool: not allocating to pool (", mempool_id.first, ", ",
                mempool_id.second, ") on device ", (int)device);
    if (it->capture) {
      nf_private_end(pool(device), it->key);
      captures_.fetch_sub(1);
    }
    routes_.erase(std::next(it).base());
    nroutes_.fetch_sub(1, std::memory_order_release);
    if (captures_.load() == 0) {
      release.swap(deferred_);
      close.swap(deferred_ipc_);
    }
  }
  for (auto& dk : release) release_now(dk.first, dk.second);
  for (auto& dm : close) ipc_release(dm.first, dm.second);
}

void NofragAllocator::releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  nf_pool_t* p = nf_torch_pool_get(device, 0);
  if (!p) return;
  uint64_t key;
  {
    std::lock_guard<std::mutex> g(routes_mu_);
    auto it = keys_.find(mempool_id);
    if (it == keys_.end()) return;
    key = it->second;
    if (nf_private_use_count(p, key) - pending(device, key) == 1 && captures_.load() != 0) {
      // The last user: the hand-back waits for the device (below), which
      // a capture forbids; do it when the captures end.
      deferred_.emplace_back(device, key);
      return;
    }
  }
  release_now(device, key);
}

void NofragAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id, std::shared_ptr<cca::CUDAAllocator> allocator) {
  // nofrag serves every pool itself: a MemPool meant for another allocator
  // (e.g. ncclMemAlloc for NCCL buffer registration) would silently get
  // nofrag memory instead, so it is refused where it is made.
  if (allocator && allocator.get() != this)
    throw_error("nofrag: torch.cuda.MemPool(allocator=...) is not supported while nofrag is PyTorch's allocator (the "
          "pool's allocations would come from nofrag, not from that allocator); create the MemPool without one");
  nf_pool_t* p = pool(device);
  std::lock_guard<std::mutex> g(routes_mu_);
  check(nf_private_incref(p, key_of(mempool_id)), "createOrIncrefPool");
}

int NofragAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) {
  nf_pool_t* p = nf_torch_pool_get(device, 0);
  std::lock_guard<std::mutex> g(routes_mu_);
  auto it = keys_.find(mempool_id);
  if (!p || it == keys_.end()) return 0;
  return (int)(nf_private_use_count(p, it->second) - pending(device, it->second));
}

bool NofragAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id, const std::unordered_set<void*>& expected_live_allocations) {
  std::vector<void*> live = live_of(device, mempool_id);
  if (live.size() != expected_live_allocations.size()) return false;
  for (void* q : live)
    if (!expected_live_allocations.count(q)) return false;
  return true;
}

namespace {
// Live blocks' allocation streams, from the pool's walk (a C callback: no
// exception may leave it).
struct StreamsOf {
  std::unordered_map<uintptr_t, cudaStream_t> m;
  bool failed = false;
  static void cb(void* ctx, const nf_torch_seg_t*, const nf_torch_blk_t* b) {
    auto* s = static_cast<StreamsOf*>(ctx);
    if (!b || b->state != 1 || s->failed) return;
    try {
      s->m.emplace(b->addr, (cudaStream_t)b->stream);
    } catch (...) {
      s->failed = true;
    }
  }
};
} // namespace

// Each live block keeps its allocation stream, as PyTorch's checkpoint does:
// a block re-created on another stream would be reused there, once freed,
// without being ordered after the stream that really used it.
std::shared_ptr<cca::AllocatorState> NofragAllocator::getCheckpointState(c10::DeviceIndex device, MempoolId_t id) {
  auto st = std::make_shared<PoolState>();
  st->id = id;
  st->device = device;
  nf_pool_t* p = nf_torch_pool_get(device, 0);
  StreamsOf streams;
  if (p) nf_torch_walk(p, &StreamsOf::cb, &streams);
  TORCH_CHECK(!streams.failed, "nofrag: getCheckpointState: out of host memory");
  cudaStream_t cur = c10::cuda::getCurrentCUDAStream(device).stream();
  for (void* q : live_of(device, id)) {
    st->live.emplace_back(q, p ? nf_block_size(p, q) : 0);
    auto it = streams.m.find((uintptr_t)q);
    st->streams.push_back(it != streams.m.end() ? it->second : cur);
  }
  return st;
}

cca::CheckpointDelta NofragAllocator::setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) {
  auto* st = dynamic_cast<PoolState*>(pps.get());
  TORCH_CHECK(st, "nofrag: setCheckpointPoolState: not a nofrag checkpoint");
  (void)pool(device); // made (or its error raised) before anything is freed
  uint64_t key;
  {
    std::lock_guard<std::mutex> g(routes_mu_);
    key = key_of(st->id);
  }
  cca::CheckpointDelta delta;
  for (void* q : live_of(device, st->id)) {
    if (tracing_.load()) trace_free(q);
    if (nexported_.load() != 0) ipc_forget(q);
    nf_torch_free_any(q);
    delta.ptrs_freed.push_back(q);
  }
  for (size_t i = 0; i < st->live.size(); i++) {
    void* q = st->live[i].first;
    void* r = nf_torch_alloc_at(device, key, q, st->live[i].second, (void*)st->streams[i]);
    TORCH_CHECK(r == q, "nofrag: setCheckpointPoolState: cannot re-create the block at ", q, ": ", lib_error());
    // Its free was recorded above: the memory history pairs it with this
    // allocation, as PyTorch's restore records both.
    if (tracing_.load()) trace_alloc(device, r, st->live[i].second, st->streams[i], st->id);
    delta.dataptrs_allocd.emplace_back(r, r, &delete_fn, c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

// Never destroyed: tensors may die during static destruction at exit.
std::shared_ptr<NofragAllocator>* g_hold = nullptr;
std::atomic<NofragAllocator*> g_alloc{nullptr};

void delete_fn(void* ptr) {
  NofragAllocator* a = g_alloc.load(std::memory_order_acquire);
  if (a) a->free_ptr(ptr);
}

// NOFRAG_SEGV_BACKTRACE=1 (the GPU bench sets it): on SIGSEGV/SIGBUS/SIGABRT
// print the native frames (execinfo), then hand the signal to the handler
// that was there before (Python's faulthandler prints the Python stack and
// re-raises). Diagnostics only: a crash inside PyTorch or a CUDA library
// otherwise leaves an empty log.
struct sigaction g_prev[3];
const int kSigs[3] = {SIGSEGV, SIGBUS, SIGABRT};

void on_fatal(int sig, siginfo_t* info, void* uc) {
  void* frames[64];
  int n = backtrace(frames, 64);
  const char m[] = "nofrag: fatal signal; native frames (most recent first):\n";
  if (write(2, m, sizeof m - 1) < 0) {
  }
  backtrace_symbols_fd(frames, n, 2);
  for (int i = 0; i < 3; i++) {
    if (kSigs[i] != sig) continue;
    sigaction(sig, &g_prev[i], nullptr);
    if ((g_prev[i].sa_flags & SA_SIGINFO) && g_prev[i].sa_sigaction) {
      g_prev[i].sa_sigaction(sig, info, uc);
    } else if (g_prev[i].sa_handler != SIG_DFL && g_prev[i].sa_handler != SIG_IGN) {
      g_prev[i].sa_handler(sig);
    }
  }
  raise(sig); // previous handler returned or was the default: die with the signal
}

void install_backtrace() {
  const char* v = getenv("NOFRAG_SEGV_BACKTRACE");
  static bool done = false;
  if (!v || !*v || strcmp(v, "0") == 0 || done) return;
  done = true;
  void* warm[1];
  backtrace(warm, 1); // loads libgcc_s now, not inside the handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER; // NODEFER: a raise() in there acts at once
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; i++) sigaction(kSigs[i], &sa, &g_prev[i]);
}

} // namespace nfa

// Install the adapter as PyTorch's CUDA allocator (before CUDA is
// initialised, as change_current_allocator requires). 0 on success, else -1
// with the reason in `err`.
extern "C" __attribute__((visibility("default"))) int nf_adapter_install(char* err, size_t n) {
  try {
    nfa::install_backtrace();
    if (!nfa::g_hold) {
      nfa::g_hold = new std::shared_ptr<nfa::NofragAllocator>(std::make_shared<nfa::NofragAllocator>());
      nfa::g_alloc.store(nfa::g_hold->get(), std::memory_order_release);
    }
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(*nfa::g_hold);
    return 0;
  } catch (const std::exception& e) {
    // The allocator's constructor turned the plug-in's raising off (it
    // raises the right types itself); the ctypes path that enable() falls
    // back to needs it on, or an OOM there hands PyTorch a NULL block.
    nfa::NofragAllocator* a = nfa::g_alloc.load();
    if (a && c10::cuda::CUDACachingAllocator::get() != a) nf_torch_set_throw(a->throw_before);
    if (err && n) snprintf(err, n, "%s", e.what());
    return -1;
  }
}

//! 1 when the adapter is PyTorch's current allocator.
extern "C" __attribute__((visibility("default"))) int nf_adapter_active(void) {
  nfa::NofragAllocator* a = nfa::g_alloc.load();
  return a && c10::cuda::CUDACachingAllocator::get() == a;
}
