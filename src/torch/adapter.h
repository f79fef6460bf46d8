// nofrag as a first-class PyTorch CUDA allocator: a subclass of PyTorch's
// CUDAPluggableAllocator (exported by libtorch_cuda) that overrides what the
// pluggable base leaves unimplemented, on top of the C library. The C++ part
// of the project: this class, adapter.cpp (statistics, cacheInfo, private
// pools, checkpoints, install) and adapter_trace.cpp (OOM, history,
// snapshots, IPC); compiled against the user's torch by
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
// the library makes no event call on it. Its driver calls run in relaxed
// capture mode, whoever captures (src/backend/cuda.c).
#pragma once

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
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

// The library's last error without its own "nofrag: " prefix (the adapter's
// messages add "nofrag: <method>: " themselves).
inline const char* lib_error() {
  const char* e = nf_last_error();
  return strncmp(e, "nofrag: ", 8) == 0 ? e + 8 : e;
}

inline bool is_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st == cudaStreamCaptureStatusActive;
}

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
    throw_before = nf_torch_set_throw(0); // failures come back as NULL: this class raises the right type
  }
  int throw_before = 1; // the plug-in's raising before this class turned it off (nf_adapter_install restores it)

  using Pluggable::recordStream;

  // ------------------------------------------------------------ allocation

  void* alloc(size_t size, c10::DeviceIndex dev, cudaStream_t stream) {
    if (size == 0) return nullptr;
    uint64_t key = 0;
    MempoolId_t pool_id{0, 0};
    if (nroutes_.load(std::memory_order_acquire) != 0) key = route(dev, stream, &pool_id);
    // (Driver calls run in relaxed capture mode: the CUDA backend sees to it.)
    void* r = key ? nf_torch_alloc_private(size, dev, (void*)stream, key) : nf_torch_alloc(size, dev, (void*)stream);
    if (!r) oom(dev, size, stream, pool_id);
    if (tracing_.load(std::memory_order_acquire)) trace_alloc(dev, r, size, stream, pool_id);
    return r;
  }

  // False: not a live block of any pool (logged; nf_torch_last_error).
  bool free_ptr(void* ptr) {
    if (!ptr) return true;
    if (tracing_.load(std::memory_order_acquire)) trace_free(ptr);
    if (nexported_.load(std::memory_order_acquire) != 0) ipc_forget(ptr);
    return nf_torch_free_any(ptr) >= 0;
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
  // As PyTorch's allocator: a pointer that is not a live block raises here
  // (the DataPtr deleter, which must not throw, only logs).
  void raw_delete(void* ptr) override {
    if (!free_ptr(ptr)) throw_error(std::string("nofrag: raw_delete: ") + nf_torch_last_error());
  }

  void init(int device_count) override {
    nf_torch_init(device_count);
    initialized_ = true;
  }
  bool initialized() override { return initialized_; }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get()) return;
    // Memory nofrag did not allocate is not its to track, as in PyTorch's
    // allocator: a CUDA IPC receiver's mapping, a tensor over CuPy's or any
    // __cuda_array_interface__ memory, a DLPack view into a block. (A block
    // whose deleter another owner swapped in, the IPC sender's, still is.)
    if (ptr.get_deleter() != &delete_fn && device_of(ptr.get(), nullptr) < 0) return;
    // The pool's events live in its device's context, and CUDA records an
    // event only on a stream of the same context; another device's default
    // stream (handle 0) would even pass for this device's. Refused, loudly.
    if (ptr.device().index() != stream.device_index())
      throw_error("nofrag: record_stream of a block on cuda:" + std::to_string((int)ptr.device().index()) +
                  " with a stream of cuda:" + std::to_string((int)stream.device_index()) +
                  " is not supported (make that stream wait on one of the block's device, or synchronize)");
    nf_torch_record_stream(ptr.get(), (void*)stream.stream());
    // A dropped record would let the block be reused while `stream` still
    // uses it: raise rather than corrupt (e.g. a pool's 64-stream bound).
    if (nf_torch_last_status() != NF_OK) throw_error(std::string("nofrag: record_stream: ") + nf_torch_last_error());
  }

  std::string name() override { return "nofrag"; }

  // ------------------------------------------------------------ peers
  // torch.cuda's get_p2p_access calls this before copies between two devices
  // with P2P: `dev` will access `dev_to_access`'s memory. cuMemMap'ed memory
  // needs a grant per mapping (cudaDeviceEnablePeerAccess covers cudaMalloc's
  // only, which the base does): nofrag grants it on every mapping of that pool.
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    Pluggable::enablePeerAccess(dev, dev_to_access);
    TORCH_CHECK(nf_torch_add_peer(dev_to_access, dev) == 0, "nofrag: enablePeerAccess(", (int)dev, ", ",
                (int)dev_to_access, "): ", nf_torch_last_error());
  }
  // Without P2P, a plain device-to-device copy between two devices' cuMemMap'ed
  // memory fails; cudaMemcpyPeerAsync stages it (as PyTorch's allocator does).
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count, cudaStream_t stream,
                          bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // ------------------------------------------------------------ stats

  double getMemoryFraction(c10::DeviceIndex device) override { return nf_torch_get_fraction(device); }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override;

  void resetAccumulatedStats(c10::DeviceIndex device) override;

  void resetPeakStats(c10::DeviceIndex device) override { nf_torch_reset_peaks(device); }

  // Largest block servable without new physical memory: the largest mapped
  // free run; a zero *largestBlock asks for an initial guess, which (as
  // PyTorch's allocator does) is what the device has free, here what the
  // pool can still take under its limit.
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;

  void emptyCache(MempoolId_t mempool_id) override;

  // Per-stream expandable-segment sizes (the pluggable base throws): nofrag's
  // granules belong to no stream's segment, so there is nothing to list.
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    (void)device;
    return {};
  }

  // ------------------------------------------------------------ private pools

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id, std::function<bool(cudaStream_t)> filter) override;

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override;

  // Called from CUDAGraph's destructor among others: never throws.
  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override;

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id, std::shared_ptr<cca::CUDAAllocator> allocator) override;

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override;

  // MemPool(use_on_oom=...) and its destructor call this (the base throws,
  // which terminated the process from ~MemPool). nofrag never serves a
  // general-pool request from a private pool's memory while it is in use; at
  // its last release the pool's memory goes back to the general pool anyway,
  // so the flag changes nothing here: accepted and ignored.
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    (void)device, (void)mempool_id, (void)use_on_oom;
  }

  // MemPool(no_split=True): PyTorch's blocks of such a pool are never split.
  // nofrag blocks are never split into pieces served to others either (a free
  // range is placed by best fit; no block carries a remainder), so no-op.
  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override { (void)device, (void)mempool_id; }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id, const std::unordered_set<void*>& expected_live_allocations) override;

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override;

  // Restore a pool to a checkpoint, as PyTorch's allocator does for graph
  // trees: every block live in the pool now is freed (ptrs_freed: PyTorch
  // turns the deleters of stale storages among them into no-ops), then every
  // block of the checkpoint is re-created at its address (dataptrs_allocd:
  // PyTorch hands them to the storages that live on). A pointer may be in both.
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) override;

  // ------------------------------------------------------------ OOM

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;

  [[noreturn]] void oom(c10::DeviceIndex dev, size_t size, cudaStream_t stream, MempoolId_t pool_id);

  // ------------------------------------------------------------ history and snapshots

  bool isHistoryEnabled() override { return history_.load(); }

  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory, const std::vector<std::string>& skip_actions) override;

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;

  cca::SnapshotInfo snapshot(MempoolId_t mempool, bool include_traces) override;

 private:
  struct Base {
    uint64_t bytes_alloc, bytes_freed, allocs, frees, create, release, reclaims, ooms, event_sync, map, unmap; // create/release: bytes
  };

  struct Walk {
    NofragAllocator* self;
    c10::DeviceIndex dev;
    const std::map<uint64_t, MempoolId_t>* ids;
    std::vector<cda::SegmentInfo> segs;
    bool failed = false; // an exception (bad_alloc) stopped the walk's copy
    // Called from C (nf_torch_walk, under the pool's lock): an exception must
    // not unwind through it, so it is caught here and the walk's result dropped.
    static void cb(void* ctx, const nf_torch_seg_t* seg, const nf_torch_blk_t* blk) {
      auto* w = static_cast<Walk*>(ctx);
      if (w->failed) return;
      try {
        add(w, seg, blk);
      } catch (...) {
        w->failed = true;
      }
    }
    static void add(Walk* w, const nf_torch_seg_t* seg, const nf_torch_blk_t* blk) {
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
    TORCH_CHECK(st == NF_OK, "nofrag: ", what, ": ", lib_error());
  }

  // A c10::Error (RuntimeError in Python) built from a std::string only (see oom()).
  [[noreturn]] static void throw_error(std::string msg) {
    throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, std::move(msg));
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
  // Serialized (release_mu_): two threads dropping a pool's last two users
  // at once would each see the other's use and neither wait nor trim. The
  // device wait must not overlap a capture: beginAllocateToPool (before
  // PyTorch begins one) takes release_mu_ too, so a capture starts only
  // after a wait under way, and one counted already defers this release
  // to the end of the captures.
  void release_now(c10::DeviceIndex device, uint64_t key) {
    nf_pool_t* p = nf_torch_pool_get(device, 0);
    if (!p) return;
    std::lock_guard<std::mutex> g(release_mu_);
    if (nf_private_use_count(p, key) == 1) {
      {
        std::lock_guard<std::mutex> r(routes_mu_); // lock order: release_mu_, then routes_mu_
        if (captures_.load() != 0) {
          deferred_.emplace_back(device, key);
          return;
        }
      }
      c10::cuda::CUDAGuard on(device); // the pool's device, not the caller's current one
      if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
      if (nf_private_trim(p, key) != NF_OK) fprintf(stderr, "nofrag: releasePool: %s\n", lib_error());
    }
    if (nf_private_release(p, key) != NF_OK) fprintf(stderr, "nofrag: releasePool: %s\n", lib_error());
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
  std::shared_ptr<c10::GatheredContext> gather(cca::RecordContext level);

  void record(c10::DeviceIndex dev, cda::TraceEntry::Action a, size_t addr, size_t size, cudaStream_t stream, MempoolId_t pool_id, std::shared_ptr<c10::GatheredContext> ctx);

  void trace_alloc(c10::DeviceIndex dev, void* r, size_t size, cudaStream_t stream, MempoolId_t pool_id);

  void trace_free(void* ptr);

 public:
  // ------------------------------------------------------------ IPC
  // The block's granules are exported as POSIX fds, which the receiving
  // process (also under nofrag) fetches with pidfd_getfd (src/torch/ipc.c
  // says what permission that needs). The fds stay open until the block is
  // freed; sharing a block again reuses its export.
  void* getBaseAllocation(void* ptr, size_t* size) override;

  cca::ShareableHandle shareIpcHandle(void* ptr) override;

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // Close the fds exported for a block being freed.
  void ipc_forget(void* ptr);

  // A received block's mapping, closed after a device wait (the unmap does
  // not wait for kernels reading it), which must not overlap a capture:
  // deferred to the end of the captures, as release_now.
  void ipc_release(c10::DeviceIndex dev, nf_ipc_map_t* m);

  // The device whose pool holds live block ptr (its size in *n), or -1.
  static int device_of(void* ptr, size_t* n);

 private:
  std::mutex routes_mu_, stats_mu_, obs_mu_, hist_mu_, ipc_mu_, release_mu_;
  // A block's export (ipc_mu_): made once, closed when the block is freed;
  // sharing the same block again returns the same handle (no new fds).
  struct Exported {
    std::vector<int> fds;
    std::string handle;
    ptrdiff_t off;
  };
  std::unordered_map<void*, Exported> exported_;
  std::atomic<int> nexported_{0};
  std::vector<Route> routes_;
  std::map<MempoolId_t, uint64_t> keys_;
  uint64_t next_key_ = 1;
  std::vector<std::pair<c10::DeviceIndex, uint64_t>> deferred_;
  std::vector<std::pair<c10::DeviceIndex, nf_ipc_map_t*>> deferred_ipc_; // (routes_mu_) ipc_release's
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

} // namespace nfa
