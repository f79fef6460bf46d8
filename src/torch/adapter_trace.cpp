// The C++ adapter (adapter.h): OOM as c10::OutOfMemoryError, memory history
// and snapshots in PyTorch's format, CUDA IPC.
#include "adapter.h"

namespace nfa {

void NofragAllocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> g(obs_mu_);
  oom_observers_.push_back(std::move(observer));
}

void NofragAllocator::oom(c10::DeviceIndex dev, size_t size, cudaStream_t stream, MempoolId_t pool_id) {
  std::string why = nf_torch_last_error();
  // Only out of memory is torch.OutOfMemoryError: code that catches it to
  // retry smaller must not retry a driver failure or the 64-stream bound.
  if (nf_torch_last_status() != NF_ERR_OOM) throw_error(std::move(why));
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
  // Built with std::string only: on the H200 the process crashed inside the
  // ostream formatting of TORCH_CHECK_WITH's arguments on this path (GPU run
  // 16). The plug-in's message (nft_fail_alloc, every failing path) already
  // starts with PyTorch's "CUDA out of memory ... Tried to allocate" line.
  std::string msg = why;
  if (!report.empty()) msg += "\n" + report;
  throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, std::move(msg)); // C10_THROW_ERROR
}

void NofragAllocator::recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory, const std::vector<std::string>& skip_actions) {
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

void NofragAllocator::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> g(hist_mu_);
  trackers_.push_back(std::move(tracker));
  tracing_.store(true);
}

cca::SnapshotInfo NofragAllocator::snapshot(MempoolId_t mempool, bool include_traces) {
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
    TORCH_CHECK(!w.failed, "nofrag: snapshot: out of host memory while listing device ", d, "'s segments");
    for (auto& seg : w.segs)
      if (!only || seg.owner_private_pool_id == mempool) out.segments.push_back(std::move(seg));
  }
  if (include_traces) {
    auto conv = clock_.makeConverter();
    // One list per device, as PyTorch's (readers index it by device).
    out.device_traces.resize(std::max<size_t>(traces_.size(), (size_t)std::max<int>(0, c10::cuda::device_count())));
    for (size_t d = 0; d < traces_.size(); d++)
      for (const auto& te : traces_[d]) {
        out.device_traces[d].push_back(te);
        // PyTorch's snapshots carry microseconds (its tsc_to_us); conv gives ns.
        out.device_traces[d].back().time_.t_ = conv(te.time_.approx_t_) / 1000;
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

std::shared_ptr<c10::GatheredContext> NofragAllocator::gather(cca::RecordContext level) {
  cca::CreateContextFn f;
  {
    std::lock_guard<std::mutex> g(hist_mu_);
    if (when_ < level || !recorder_) return nullptr;
    f = recorder_;
  }
  return f(); // outside the lock: the recorder takes the GIL
}

void NofragAllocator::record(c10::DeviceIndex dev, cda::TraceEntry::Action a, size_t addr, size_t size, cudaStream_t stream, MempoolId_t pool_id, std::shared_ptr<c10::GatheredContext> ctx) {
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

void NofragAllocator::trace_alloc(c10::DeviceIndex dev, void* r, size_t size, cudaStream_t stream, MempoolId_t pool_id) {
  auto ctx = gather(cca::RecordContext::STATE);
  {
    std::lock_guard<std::mutex> g(hist_mu_);
    if (ctx) contexts_[r] = ctx;
    if (when_ < cca::RecordContext::ALLOC) ctx = nullptr; // STATE: stacks of live blocks only
  }
  record(dev, cda::TraceEntry::ALLOC, (size_t)r, size, stream, pool_id, std::move(ctx));
}

void NofragAllocator::trace_free(void* ptr) {
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

void* NofragAllocator::getBaseAllocation(void* ptr, size_t* size) {
  int dev = device_of(ptr, size);
  if (dev < 0 && size) *size = 0;
  return ptr;
}

cca::ShareableHandle NofragAllocator::shareIpcHandle(void* ptr) {
  size_t n = 0;
  int dev = device_of(ptr, &n);
  TORCH_CHECK(dev >= 0, "nofrag: shareIpcHandle: ", ptr, " is not a live nofrag block");
  {
    // Shared before (a tensor sent to several processes, or again): the same
    // fds serve every receiver; a new export each time leaked fds per share.
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto it = exported_.find(ptr);
    if (it != exported_.end()) return cca::ShareableHandle{it->second.off, it->second.handle};
  }
  nf_pool_t* p = nf_torch_pool_get(dev, 0);
  std::vector<int> fds(n / 4096 + 4); // granules are >= 4 KiB
  std::string buf(64 + fds.size() * 32, '\0');
  size_t nfds = 0;
  uint64_t off = 0;
  nf_status_t st = nf_ipc_export(p, ptr, &buf[0], buf.size(), fds.data(), fds.size(), &nfds, &off);
  TORCH_CHECK(st == NF_OK, "nofrag: shareIpcHandle: ", lib_error());
  fds.resize(nfds);
  buf.resize(strlen(buf.c_str()));
  std::lock_guard<std::mutex> g(ipc_mu_);
  auto ins = exported_.emplace(ptr, Exported{fds, buf, (ptrdiff_t)off});
  if (!ins.second) { // another thread exported it meanwhile: keep the first export
    for (int fd : fds) close(fd);
    return cca::ShareableHandle{ins.first->second.off, ins.first->second.handle};
  }
  nexported_.store((int)exported_.size());
  return cca::ShareableHandle{(ptrdiff_t)off, buf};
}

std::shared_ptr<void> NofragAllocator::getIpcDevPtr(std::string handle) {
  c10::DeviceIndex dev = c10::cuda::current_device();
  void* base = nullptr;
  nf_ipc_map_t* m = nullptr;
  nf_status_t st = nf_ipc_import(nf_pool_backend(pool(dev)), handle.c_str(), &base, &m);
  TORCH_CHECK(st == NF_OK, "nofrag: getIpcDevPtr: ", lib_error());
  // The allocator is never destroyed (g_hold): `this` outlives the tensor.
  return std::shared_ptr<void>(base, [this, m, dev](void*) { ipc_release(dev, m); });
}

void NofragAllocator::ipc_release(c10::DeviceIndex dev, nf_ipc_map_t* m) {
  std::lock_guard<std::mutex> rel(release_mu_); // as release_now: no capture begins during the wait
  {
    std::lock_guard<std::mutex> g(routes_mu_);
    if (captures_.load() != 0) {
      deferred_ipc_.emplace_back(dev, m);
      return;
    }
  }
  // Unmapping does not wait for kernels still reading the range (as in
  // PyTorch's expandable segments): wait for the device the range is on.
  c10::cuda::CUDAGuard on(dev);
  if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  nf_ipc_close(m);
}

void NofragAllocator::ipc_forget(void* ptr) {
  std::lock_guard<std::mutex> g(ipc_mu_);
  auto it = exported_.find(ptr);
  if (it == exported_.end()) return;
  for (int fd : it->second.fds) close(fd);
  exported_.erase(it);
  nexported_.store((int)exported_.size());
}

int NofragAllocator::device_of(void* ptr, size_t* n) {
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

} // namespace nfa
