// nofrag as a first-class PyTorch CUDA allocator: a subclass of PyTorch's
// CUDAPluggableAllocator (exported by libtorch_cuda) that overrides what the
// pluggable base leaves unimplemented, on top of the C library. The one C++
// file of the project; compiled against the user's torch by
// python/nofrag/torch_adapter.py (torch.utils.cpp_extension, offline) and
// installed by nofrag.torch.enable() through nf_adapter_install() (ctypes).
// Written against PyTorch 2.11's headers (c10/cuda/CUDACachingAllocator.h,
// torch/csrc/cuda/CUDAPluggableAllocator.h); older versions fail to compile
// here and enable() falls back to the ctypes path.
//
// What it adds over the pluggable base (docs/pytorch.md has the table):
// - private pools (CUDA graphs, torch.compile's graph trees, MemPool and
//   use_mem_pool): begin/endAllocateToPool, releasePool, createOrIncrefPool,
//   getPoolUseCount, emptyCache(pool), checkPoolLiveAllocations,
//   get/setCheckpointState, routed to the C library's private pools;
// - getDeviceStats / resetPeakStats / resetAccumulatedStats /
//   getMemoryFraction, cacheInfo (what cuDNN bounds its workspace with);
// - OOM: c10::OutOfMemoryError (torch.OutOfMemoryError) carrying nofrag's
//   report, after the attached OOM observers ran;
// - recordHistory / snapshot: segments and blocks in PyTorch's format from
//   the pool's layout (nf_torch_walk), device traces with the frames
//   PyTorch's context recorder gives.
// - CUDA IPC (torch.multiprocessing): shareIpcHandle / getIpcDevPtr export
//   the block's granules as POSIX fds that the receiver (also under nofrag)
//   fetches with pidfd_getfd (src/torch/ipc.c).
//
// Captures: PyTorch calls beginAllocateToPool before cudaStreamBeginCapture
// on the current stream, with a filter that is true for streams in that
// capture; a use_mem_pool filter is true for the calling thread. So a filter
// false on the current stream at begin marks a capture: that stream (and any
// other stream found capturing into the pool later) gets a C stream route, so
// the library makes no event call on it. Library calls made while a capture
// is under way run in relaxed capture mode (mapping memory is allowed then).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

extern "C" {
#include "torch.h" // src/torch/torch.h (this directory; includes nofrag.h)
}

#if !(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11))
#error "nofrag adapter: written against PyTorch 2.11's CUDAAllocator interface; this torch is older (enable() uses the ctypes path)"
#endif

namespace nfa {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using c10::MempoolId_t;
using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

constexpr int kMaxDev = 64;

std::string fmt_bytes(uint64_t n) {
  char b[64];
  if (n >= (1ull << 30)) snprintf(b, sizeof b, "%.2f GiB", (double)n / (double)(1ull << 30));
  else if (n >= (1ull << 20)) snprintf(b, sizeof b, "%.2f MiB", (double)n / (double)(1ull << 20));
  else snprintf(b, sizeof b, "%llu B", (unsigned long long)n);
  return b;
}

bool is_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st == cudaStreamCaptureStatusActive;
}

// Relaxed capture mode on this thread while a capture is under way: mapping
// memory (cuMemCreate / cuMemMap) is not allowed in global mode.
struct RelaxedCapture {
  bool on;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  explicit RelaxedCapture(bool active) : on(active) {
    if (on) cudaThreadExchangeStreamCaptureMode(&mode);
  }
  ~RelaxedCapture() {
    if (on) cudaThreadExchangeStreamCaptureMode(&mode);
  }
};

struct Route {
  MempoolId_t id;
  uint64_t key;
  c10::DeviceIndex device;
  std::function<bool(cudaStream_t)> filter;
  bool capture;
  std::vector<cudaStream_t> streams; // given a C stream route
};

// getCheckpointState: the live blocks of a private pool.
struct PoolState : cca::AllocatorState {
  MempoolId_t id;
  c10::DeviceIndex device = 0;
  std::vector<std::pair<void*, size_t>> live; // address, requested size
  std::vector<cudaStream_t> streams;
};

void delete_fn(void* ptr); // the DataPtr deleter

class NofragAllocator final : public Pluggable {
 public:
  NofragAllocator()
      : Pluggable(
            [](size_t n, int dev, cudaStream_t s) { return nf_torch_alloc(n, dev, (void*)s); },
            [](void* p, size_t n, int dev, cudaStream_t s) { nf_torch_free(p, n, dev, (void*)s); }) {
    nf_torch_set_throw(0); // failures come back as NULL: this class raises the right type
  }

  using Pluggable::recordStream;

  // ------------------------------------------------------------ allocation

  void* alloc(size_t size, c10::DeviceIndex dev, cudaStream_t stream) {
    if (size == 0) return nullptr;
    uint64_t key = 0;
    MempoolId_t pool_id{0, 0};
    if (nroutes_.load(std::memory_order_acquire) != 0) key = route(dev, stream, &pool_id);
    void* r;
    {
      RelaxedCapture g(captures_.load(std::memory_order_acquire) != 0);
      r = key ? nf_torch_alloc_private(size, dev, (void*)stream, key) : nf_torch_alloc(size, dev, (void*)stream);
    }
    if (!r) oom(dev, size, stream, pool_id);
    if (tracing_.load(std::memory_order_acquire)) trace_alloc(dev, r, size, stream, pool_id);
    return r;
  }

  void free_ptr(void* ptr) {
    if (!ptr) return;
    if (tracing_.load(std::memory_order_acquire)) trace_free(ptr);
    if (nexported_.load(std::memory_order_acquire) != 0) ipc_forget(ptr);
    RelaxedCapture g(captures_.load(std::memory_order_acquire) != 0);
    nf_torch_free_any(ptr);
  }

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex dev = c10::cuda::current_device();
    cudaStream_t s = c10::cuda::getCurrentCUDAStream(dev).stream();
    void* r = alloc(size, dev, s);
    return {r, r, &delete_fn, c10::Device(c10::DeviceType::CUDA, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_fn; }
  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex dev = c10::cuda::current_device();
    return alloc(nbytes, dev, c10::cuda::getCurrentCUDAStream(dev).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return alloc(nbytes, c10::cuda::current_device(), stream);
  }
  void raw_delete(void* ptr) override { free_ptr(ptr); }

  void init(int device_count) override {
    nf_torch_init(device_count);
    initialized_ = true;
  }
  bool initialized() override { return initialized_; }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get()) return;
    nf_torch_record_stream(ptr.get(), (void*)stream.stream());
  }

  std::string name() override { return "nofrag"; }

  // ------------------------------------------------------------ stats

  double getMemoryFraction(c10::DeviceIndex device) override { return nf_torch_get_fraction(device); }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "nofrag: memory fraction ", fraction, " out of range 0..1");
    nf_torch_set_fraction(fraction, device);
  }

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    cda::DeviceStats out;
    nf_stats_t s;
    uint64_t c[5] = {0, 0, 0, 0, 0};
    if (nf_torch_stats(device, &s) != 0) return out;
    nf_torch_counters(device, c, 5);
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
    set(out.reserved_bytes, s.physical, s.physical_peak, acc(s.calls.create, b.create) * (int64_t)gr,
        acc(s.calls.release, b.release) * (int64_t)gr);
    set(out.inactive_split_bytes, s.cached, s.cached, 0, 0);
    set(out.allocation, s.live_blocks, s.live_blocks, acc(s.allocs, b.allocs), acc(s.frees, b.frees));
    set(out.active, s.live_blocks, s.live_blocks, acc(s.allocs, b.allocs), acc(s.frees, b.frees));
    set(out.segment, s.physical / gr, s.physical_peak / gr, acc(s.calls.create, b.create), acc(s.calls.release, b.release));
    out.num_alloc_retries = acc(s.reclaims, b.reclaims);
    out.num_ooms = acc(s.ooms, b.ooms);
    out.num_sync_all_streams = acc(s.calls.event_sync, b.event_sync);
    out.num_device_alloc = acc(s.calls.map, b.map);
    out.num_device_free = acc(s.calls.unmap, b.unmap);
    out.max_split_size = -1;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    nf_stats_t s;
    uint64_t c[5] = {0, 0, 0, 0, 0};
    if (nf_torch_stats(device, &s) != 0) return;
    nf_torch_counters(device, c, 5);
    std::lock_guard<std::mutex> g(stats_mu_);
    base_[device] = Base{c[0], c[1], s.allocs, s.frees, s.calls.create, s.calls.release, s.reclaims,
                         s.ooms, s.calls.event_sync, s.calls.map, s.calls.unmap};
  }

  void resetPeakStats(c10::DeviceIndex device) override { nf_torch_reset_peaks(device); }

  // Largest block servable without new physical memory: the largest mapped
  // free run; a zero *largestBlock asks for an initial guess, which (as
  // PyTorch's allocator does) is what the device has free, here what the
  // pool can still take under its limit.
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
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

  void emptyCache(MempoolId_t mempool_id) override {
    if (mempool_id.first == 0 && mempool_id.second == 0) {
      if (captures_.load() != 0) return; // PyTorch's allocator does not release during a capture either
      nf_torch_reset();
      return;
    }
    // A released pool was trimmed and handed back already (release_now).
    std::lock_guard<std::mutex> g(routes_mu_);
    auto it = keys_.find(mempool_id);
    if (it == keys_.end()) return;
    for (int d = 0; d < kMaxDev; d++) {
      nf_pool_t* p = nf_torch_pool_get(d, 0);
      if (!p || !nf_private_use_count(p, it->second)) continue;
      nf_status_t st = nf_private_trim(p, it->second);
      TORCH_CHECK(st == NF_OK, "nofrag: emptyCache of pool (", mempool_id.first, ", ", mempool_id.second, "): ",
                  nf_last_error());
    }
  }

  // ------------------------------------------------------------ private pools

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    nf_pool_t* p = pool(device);
    std::lock_guard<std::mutex> g(routes_mu_);
    for (const Route& r : routes_)
      TORCH_CHECK(r.id != mempool_id, "nofrag: beginAllocateToPool: already allocating to pool (", mempool_id.first,
                  ", ", mempool_id.second, ")");
    uint64_t key = key_of(mempool_id);
    check(nf_private_incref(p, key), "beginAllocateToPool");
    Route r{mempool_id, key, device, std::move(filter), false, {}};
    cudaStream_t cur = c10::cuda::getCurrentCUDAStream(device).stream();
    if (is_capturing(cur) || !r.filter(cur)) { // a capture (see the header comment)
      check(nf_private_begin(p, key, (nf_stream_t)cur), "beginAllocateToPool");
      r.capture = true;
      r.streams.push_back(cur);
      captures_.fetch_add(1);
    }
    routes_.push_back(std::move(r));
    nroutes_.fetch_add(1, std::memory_order_release);
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    std::vector<std::pair<c10::DeviceIndex, uint64_t>> release;
    {
      std::lock_guard<std::mutex> g(routes_mu_);
      auto it = std::find_if(routes_.rbegin(), routes_.rend(), [&](const Route& r) { return r.id == mempool_id; });
      TORCH_CHECK(it != routes_.rend(), "nofrag: endAllocateToPool: not allocating to pool (", mempool_id.first, ", ",
                  mempool_id.second, ")");
      if (it->capture) {
        nf_private_end(pool(device), it->key);
        captures_.fetch_sub(1);
      }
      routes_.erase(std::next(it).base());
      nroutes_.fetch_sub(1, std::memory_order_release);
      if (captures_.load() == 0) release.swap(deferred_);
    }
    for (auto& dk : release) release_now(dk.first, dk.second);
  }

  // Called from CUDAGraph's destructor among others: never throws.
  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
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

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    (void)allocator; // nofrag serves every pool itself
    nf_pool_t* p = pool(device);
    std::lock_guard<std::mutex> g(routes_mu_);
    check(nf_private_incref(p, key_of(mempool_id)), "createOrIncrefPool");
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    nf_pool_t* p = nf_torch_pool_get(device, 0);
    std::lock_guard<std::mutex> g(routes_mu_);
    auto it = keys_.find(mempool_id);
    if (!p || it == keys_.end()) return 0;
    return (int)(nf_private_use_count(p, it->second) - pending(device, it->second));
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<void*> live = live_of(device, mempool_id);
    if (live.size() != expected_live_allocations.size()) return false;
    for (void* q : live)
      if (!expected_live_allocations.count(q)) return false;
    return true;
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    auto st = std::make_shared<PoolState>();
    st->id = id;
    st->device = device;
    nf_pool_t* p = nf_torch_pool_get(device, 0);
    cudaStream_t cur = c10::cuda::getCurrentCUDAStream(device).stream();
    for (void* q : live_of(device, id)) {
      st->live.emplace_back(q, p ? nf_block_size(p, q) : 0);
      st->streams.push_back(cur);
    }
    return st;
  }

  // Restore a pool to a checkpoint, as PyTorch's allocator does for graph
  // trees: every block live in the pool now is freed (ptrs_freed: PyTorch
  // turns the deleters of stale storages among them into no-ops), then every
  // block of the checkpoint is re-created at its address (dataptrs_allocd:
  // PyTorch hands them to the storages that live on). A pointer may be in both.
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override {
    auto* st = dynamic_cast<PoolState*>(pps.get());
    TORCH_CHECK(st, "nofrag: setCheckpointPoolState: not a nofrag checkpoint");
    nf_pool_t* p = pool(device);
    uint64_t key;
    {
      std::lock_guard<std::mutex> g(routes_mu_);
      key = key_of(st->id);
    }
    cca::CheckpointDelta delta;
    for (void* q : live_of(device, st->id)) {
      if (tracing_.load()) trace_free(q);
      nf_torch_free_any(q);
      delta.ptrs_freed.push_back(q);
    }
    RelaxedCapture g(captures_.load() != 0);
    for (size_t i = 0; i < st->live.size(); i++) {
      void* q = st->live[i].first;
      void* r = nf_alloc_at(p, key, q, st->live[i].second, (nf_stream_t)st->streams[i]);
      TORCH_CHECK(r == q, "nofrag: setCheckpointPoolState: cannot re-create the block at ", q, ": ", nf_last_error());
      delta.dataptrs_allocd.emplace_back(r, r, &delete_fn, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // ------------------------------------------------------------ OOM

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(obs_mu_);
    oom_observers_.push_back(std::move(observer));
  }

  [[noreturn]] void oom(c10::DeviceIndex dev, size_t size, cudaStream_t stream, MempoolId_t pool_id) {
    std::string why = nf_torch_last_error();
    std::string report = nf_last_oom_report();
    nf_stats_t s;
    nf_torch_stats(dev, &s);
    size_t dfree = 0, dtotal = 0;
    if (cudaMemGetInfo(&dfree, &dtotal) != cudaSuccess) (void)cudaGetLastError();
    std::vector<cca::OutOfMemoryObserver> obs;
    {
      std::lock_guard<std::mutex> g(obs_mu_);
      obs = oom_observers_;
    }
    if (tracing_.load()) record(dev, cda::TraceEntry::OOM, dfree, size, stream, pool_id, nullptr);
    for (auto& o : obs) o(dev, size, (size_t)s.limit, dfree);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (nofrag). Tried to allocate ", fmt_bytes(size),
                     " on device ", (int)dev, ". ", why, report.empty() ? "" : "\n", report);
  }

  // ------------------------------------------------------------ history and snapshots

  bool isHistoryEnabled() override { return history_.load(); }

  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    std::lock_guard<std::mutex> g(hist_mu_);
    history_.store(enabled);
    recorder_ = enabled ? context_recorder : nullptr;
    when_ = enabled ? when : cca::RecordContext::NEVER;
    max_entries_ = std::max<size_t>(1, alloc_trace_max_entries);
    skip_.clear();
    for (const auto& a : skip_actions) skip_.insert(cda::parseTraceEntryAction(a));
    if (clearHistory) {
      for (auto& t : traces_) t.clear();
      contexts_.clear();
    }
    if (!enabled) contexts_.clear();
    tracing_.store(enabled || !trackers_.empty());
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> g(hist_mu_);
    trackers_.push_back(std::move(tracker));
    tracing_.store(true);
  }

  cca::SnapshotInfo snapshot(MempoolId_t mempool, bool include_traces) override {
    cca::SnapshotInfo out;
    std::map<uint64_t, MempoolId_t> ids;
    {
      std::lock_guard<std::mutex> g(routes_mu_);
      for (auto& kv : keys_) ids[kv.second] = kv.first;
    }
    bool only = mempool.first != 0 || mempool.second != 0;
    std::lock_guard<std::mutex> g(hist_mu_);
    for (int d = 0; d < kMaxDev; d++) {
      nf_pool_t* p = nf_torch_pool_get(d, 0);
      if (!p) continue;
      Walk w{this, (c10::DeviceIndex)d, &ids, {}};
      nf_torch_walk(p, &Walk::cb, &w);
      for (auto& seg : w.segs)
        if (!only || seg.owner_private_pool_id == mempool) out.segments.push_back(std::move(seg));
    }
    if (include_traces) {
      auto conv = clock_.makeConverter();
      out.device_traces.resize(traces_.size());
      for (size_t d = 0; d < traces_.size(); d++)
        for (const auto& te : traces_[d]) {
          out.device_traces[d].push_back(te);
          out.device_traces[d].back().time_.t_ = conv(te.time_.approx_t_);
        }
    }
    out.config_metadata.garbage_collection_threshold = 0.0;
    out.config_metadata.max_split_size = SIZE_MAX;
    out.config_metadata.pinned_num_register_threads = 0;
    out.config_metadata.expandable_segments = true; // granules mapped on demand, as expandable segments
    out.config_metadata.release_lock_on_malloc = false;
    out.config_metadata.pinned_use_host_register = false;
    out.config_metadata.graph_capture_record_stream_reuse = false;
    out.config_metadata.last_allocator_settings = "nofrag";
    return out;
  }

 private:
  struct Base {
    uint64_t bytes_alloc, bytes_freed, allocs, frees, create, release, reclaims, ooms, event_sync, map, unmap;
  };

  struct Walk {
    NofragAllocator* self;
    c10::DeviceIndex dev;
    const std::map<uint64_t, MempoolId_t>* ids;
    std::vector<cda::SegmentInfo> segs;
    static void cb(void* ctx, const nf_torch_seg_t* seg, const nf_torch_blk_t* blk) {
      auto* w = static_cast<Walk*>(ctx);
      if (seg) {
        cda::SegmentInfo si;
        si.device = w->dev;
        si.address = (size_t)seg->addr;
        si.total_size = (size_t)seg->size;
        si.is_large = seg->large != 0;
        si.is_expandable = true;
        if (seg->private_id) {
          auto it = w->ids->find(seg->private_id);
          if (it != w->ids->end()) si.owner_private_pool_id = it->second;
        }
        w->segs.push_back(std::move(si));
        return;
      }
      if (w->segs.empty()) return;
      cda::SegmentInfo& si = w->segs.back();
      cda::BlockInfo bi;
      bi.size = (size_t)blk->size;
      bi.requested_size = (size_t)blk->req;
      bi.allocated = blk->state == 1;
      bi.active = blk->state != 0;
      if (bi.allocated) {
        auto it = w->self->contexts_.find((void*)blk->addr); // hist_mu_ held by snapshot()
        if (it != w->self->contexts_.end()) bi.context_when_allocated = it->second;
        si.allocated_size += bi.size;
        si.requested_size += bi.requested_size;
        if (!si.stream) si.stream = blk->stream;
      }
      if (bi.active) si.active_size += bi.size;
      si.blocks.push_back(std::move(bi));
    }
  };

  static void check(nf_status_t st, const char* what) {
    TORCH_CHECK(st == NF_OK, "nofrag: ", what, ": ", nf_last_error());
  }

  nf_pool_t* pool(c10::DeviceIndex device) {
    nf_pool_t* p = nf_torch_pool_get(device, 1);
    TORCH_CHECK(p, "nofrag: no pool for device ", (int)device, ": ", nf_torch_last_error());
    return p;
  }

  // Under routes_mu_: the library's id for a PyTorch pool id (made on first use).
  uint64_t key_of(MempoolId_t id) {
    auto it = keys_.find(id);
    if (it != keys_.end()) return it->second;
    uint64_t k = next_key_++;
    keys_.emplace(id, k);
    return k;
  }

  // Under routes_mu_: releases of `key` deferred to the end of the captures.
  uint64_t pending(c10::DeviceIndex device, uint64_t key) const {
    uint64_t n = 0;
    for (auto& dk : deferred_) n += dk.first == device && dk.second == key;
    return n;
  }

  // The pool allocations on `stream` go to (innermost route first), 0: none.
  uint64_t route(c10::DeviceIndex dev, cudaStream_t stream, MempoolId_t* id) {
    std::lock_guard<std::mutex> g(routes_mu_);
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (it->device != dev || !it->filter(stream)) continue;
      if (it->capture && std::find(it->streams.begin(), it->streams.end(), stream) == it->streams.end() &&
          is_capturing(stream)) {
        // Another stream of the capture (forked inside it): no events on it either.
        if (nf_private_begin(pool(dev), it->key, (nf_stream_t)stream) == NF_OK) it->streams.push_back(stream);
      }
      *id = it->id;
      return it->key;
    }
    return 0;
  }

  // The last user is gone: graph replays may still run on streams the pool
  // never saw, so wait for the device; then give the pool's cached memory
  // back (PyTorch's allocator frees a released pool's blocks at
  // emptyCache(pool), which MemPool's destructor calls right after) and hand
  // the rest (live blocks) to the general pool.
  void release_now(c10::DeviceIndex device, uint64_t key) {
    nf_pool_t* p = nf_torch_pool_get(device, 0);
    if (!p) return;
    if (nf_private_use_count(p, key) == 1) {
      if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
      if (nf_private_trim(p, key) != NF_OK) fprintf(stderr, "nofrag: releasePool: %s\n", nf_last_error());
    }
    if (nf_private_release(p, key) != NF_OK) fprintf(stderr, "nofrag: releasePool: %s\n", nf_last_error());
  }

  std::vector<void*> live_of(c10::DeviceIndex device, MempoolId_t id) {
    nf_pool_t* p = nf_torch_pool_get(device, 0);
    uint64_t key = 0;
    {
      std::lock_guard<std::mutex> g(routes_mu_);
      auto it = keys_.find(id);
      if (it != keys_.end()) key = it->second;
    }
    std::vector<void*> v;
    if (!p || !key) return v;
    for (;;) {
      size_t n = nf_private_live(p, key, nullptr, 0);
      v.resize(n);
      size_t m = nf_private_live(p, key, v.data(), n);
      if (m <= n) {
        v.resize(m);
        return v;
      }
    }
  }

  // ---- traces
  std::shared_ptr<c10::GatheredContext> gather(cca::RecordContext level) {
    cca::CreateContextFn f;
    {
      std::lock_guard<std::mutex> g(hist_mu_);
      if (when_ < level || !recorder_) return nullptr;
      f = recorder_;
    }
    return f(); // outside the lock: the recorder takes the GIL
  }

  void record(c10::DeviceIndex dev, cda::TraceEntry::Action a, size_t addr, size_t size, cudaStream_t stream,
              MempoolId_t pool_id, std::shared_ptr<c10::GatheredContext> ctx) {
    std::lock_guard<std::mutex> g(hist_mu_);
    if (skip_.count(a)) return;
    cda::TraceEntry te(a, dev, addr, size, (void*)stream, pool_id, c10::getApproximateTime(), std::move(ctx));
    for (auto& t : trackers_) t(te);
    if (!history_.load()) return;
    if (traces_.size() <= (size_t)dev) traces_.resize((size_t)dev + 1);
    auto& q = traces_[(size_t)dev];
    q.push_back(std::move(te));
    while (q.size() > max_entries_) q.pop_front();
  }

  void trace_alloc(c10::DeviceIndex dev, void* r, size_t size, cudaStream_t stream, MempoolId_t pool_id) {
    auto ctx = gather(cca::RecordContext::STATE);
    {
      std::lock_guard<std::mutex> g(hist_mu_);
      if (ctx) contexts_[r] = ctx;
      if (when_ < cca::RecordContext::ALLOC) ctx = nullptr; // STATE: stacks of live blocks only
    }
    record(dev, cda::TraceEntry::ALLOC, (size_t)r, size, stream, pool_id, std::move(ctx));
  }

  void trace_free(void* ptr) {
    int dev = -1;
    size_t n = 0;
    nf_pool_t* p = nullptr;
    for (int d = 0; d < kMaxDev && !n; d++)
      if ((p = nf_torch_pool_get(d, 0)) && (n = nf_block_size(p, ptr))) dev = d;
    if (dev < 0) return;
    uint64_t key = nf_private_of(p, ptr);
    MempoolId_t pool_id{0, 0};
    if (key) {
      std::lock_guard<std::mutex> g(routes_mu_);
      for (auto& kv : keys_)
        if (kv.second == key) pool_id = kv.first;
    }
    auto ctx = gather(cca::RecordContext::ALL);
    {
      std::lock_guard<std::mutex> g(hist_mu_);
      contexts_.erase(ptr);
    }
    // nofrag frees at once (a record_stream'd block waits inside the pool,
    // where PyTorch cannot see it): requested and completed together.
    record((c10::DeviceIndex)dev, cda::TraceEntry::FREE_REQUESTED, (size_t)ptr, n, nullptr, pool_id, ctx);
    record((c10::DeviceIndex)dev, cda::TraceEntry::FREE_COMPLETED, (size_t)ptr, n, nullptr, pool_id, ctx);
  }

 public:
  // ------------------------------------------------------------ IPC
  // The block's granules are exported as POSIX fds, which the receiving
  // process (also under nofrag) fetches with pidfd_getfd (src/torch/ipc.c
  // says what permission that needs). The fds stay open until the block is
  // freed.
  void* getBaseAllocation(void* ptr, size_t* size) override {
    int dev = device_of(ptr, size);
    if (dev < 0 && size) *size = 0;
    return ptr;
  }

  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    size_t n = 0;
    int dev = device_of(ptr, &n);
    TORCH_CHECK(dev >= 0, "nofrag: shareIpcHandle: ", ptr, " is not a live nofrag block");
    nf_pool_t* p = nf_torch_pool_get(dev, 0);
    std::vector<int> fds(n / 4096 + 4); // granules are >= 4 KiB
    std::string buf(64 + fds.size() * 32, '\0');
    size_t nfds = 0;
    uint64_t off = 0;
    nf_status_t st = nf_ipc_export(p, ptr, &buf[0], buf.size(), fds.data(), fds.size(), &nfds, &off);
    TORCH_CHECK(st == NF_OK, "nofrag: shareIpcHandle: ", nf_last_error());
    fds.resize(nfds);
    {
      std::lock_guard<std::mutex> g(ipc_mu_);
      auto& v = exported_[ptr];
      v.insert(v.end(), fds.begin(), fds.end());
      nexported_.store((int)exported_.size());
    }
    buf.resize(strlen(buf.c_str()));
    return cca::ShareableHandle{(ptrdiff_t)off, buf};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    c10::DeviceIndex dev = c10::cuda::current_device();
    void* base = nullptr;
    nf_ipc_map_t* m = nullptr;
    nf_status_t st = nf_ipc_import(nf_pool_backend(pool(dev)), handle.c_str(), &base, &m);
    TORCH_CHECK(st == NF_OK, "nofrag: getIpcDevPtr: ", nf_last_error());
    return std::shared_ptr<void>(base, [m](void*) { nf_ipc_close(m); });
  }

  // Close the fds exported for a block being freed.
  void ipc_forget(void* ptr) {
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto it = exported_.find(ptr);
    if (it == exported_.end()) return;
    for (int fd : it->second) close(fd);
    exported_.erase(it);
    nexported_.store((int)exported_.size());
  }

  // The device whose pool holds live block ptr (its size in *n), or -1.
  static int device_of(void* ptr, size_t* n) {
    for (int d = 0; d < kMaxDev; d++) {
      nf_pool_t* p = nf_torch_pool_get(d, 0);
      size_t k = p ? nf_block_size(p, ptr) : 0;
      if (k) {
        if (n) *n = k;
        return d;
      }
    }
    return -1;
  }

 private:
  std::mutex routes_mu_, stats_mu_, obs_mu_, hist_mu_, ipc_mu_;
  std::unordered_map<void*, std::vector<int>> exported_; // ipc_mu_
  std::atomic<int> nexported_{0};
  std::vector<Route> routes_;
  std::map<MempoolId_t, uint64_t> keys_;
  uint64_t next_key_ = 1;
  std::vector<std::pair<c10::DeviceIndex, uint64_t>> deferred_;
  std::atomic<int> nroutes_{0}, captures_{0};
  std::unordered_map<int, Base> base_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  // history (hist_mu_)
  std::atomic<bool> history_{false}, tracing_{false};
  cca::CreateContextFn recorder_ = nullptr;
  cca::RecordContext when_ = cca::RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::unordered_set<int> skip_set_;
  std::set<cda::TraceEntry::Action> skip_;
  std::vector<std::deque<cda::TraceEntry>> traces_;
  std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  c10::ApproximateClockToUnixTimeConverter clock_;
};

// Never destroyed: tensors may die during static destruction at exit.
std::shared_ptr<NofragAllocator>* g_hold = nullptr;
std::atomic<NofragAllocator*> g_alloc{nullptr};

void delete_fn(void* ptr) {
  NofragAllocator* a = g_alloc.load(std::memory_order_acquire);
  if (a) a->free_ptr(ptr);
}

} // namespace nfa

// Install the adapter as PyTorch's CUDA allocator (before CUDA is
// initialised, as change_current_allocator requires). 0 on success, else -1
// with the reason in `err`.
extern "C" __attribute__((visibility("default"))) int nf_adapter_install(char* err, size_t n) {
  try {
    if (!nfa::g_hold) {
      nfa::g_hold = new std::shared_ptr<nfa::NofragAllocator>(std::make_shared<nfa::NofragAllocator>());
      nfa::g_alloc.store(nfa::g_hold->get(), std::memory_order_release);
    }
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(*nfa::g_hold);
    return 0;
  } catch (const std::exception& e) {
    if (err && n) snprintf(err, n, "%s", e.what());
    return -1;
  }
}

//! 1 when the adapter is PyTorch's current allocator.
extern "C" __attribute__((visibility("default"))) int nf_adapter_active(void) {
  nfa::NofragAllocator* a = nfa::g_alloc.load();
  return a && c10::cuda::CUDACachingAllocator::get() == a;
}
