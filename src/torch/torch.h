// The PyTorch plug-in's C entry points (src/torch/plugin.c), exported from
// libnofrag for PyTorch's CUDAPluggableAllocator (nf_torch_alloc/free take
// its signatures) and for the Python package (python/nofrag/_lib.py declares
// their ctypes signatures from this header). One pool per device, created on
// first use from NOFRAG_CONF or nf_torch_configure().
#ifndef NF_TORCH_H
#define NF_TORCH_H

#include "nofrag.h"

#include <stddef.h>
#include <stdint.h>

//! The plug-in's pool for `device`, or NULL if that device has not allocated
//! through nofrag yet (for nofrag.snapshot() and stats of the torch pools).
NF_API nf_pool_t *nf_torch_pool(int device);

//! While `min_bytes` > 0, this thread's allocations of at least `min_bytes`
//! are placed in host memory at once (allocated, offloaded, waited for): the
//! device sees at most one such block at a time. The blocks are then used in
//! place by the GPU (nf_offload's host tier). Returns the previous value.
NF_API size_t nf_torch_set_host_alloc(size_t min_bytes);

NF_API void *nf_torch_alloc(size_t size, int device, void *stream);

NF_API void nf_torch_free(void *ptr, size_t size, int device, void *stream);

NF_API void nf_torch_init(int device_count);

NF_API int nf_torch_device_count(void);

//! empty_cache: give every cached granule back to the driver, on every device
//! (PyTorch's reset hook carries no device).
NF_API void nf_torch_reset(void);

//! set_per_process_memory_fraction: limit = fraction x the device's total
//! memory, as PyTorch's allocator computes it (cudaMemGetInfo's total). A
//! fraction leaving less than one granule (0 too) fails every request.
NF_API void nf_torch_set_fraction(double fraction, int device);

NF_API double nf_torch_get_fraction(int device);

//! Tensor.record_stream: the block must not be reused before `stream`'s work
//! queued up to its free completes. The hook carries no device: find the
//! pool that owns the pointer.
NF_API void nf_torch_record_stream(void *ptr, void *stream);

//! Fill `out`; returns 0 (pool exists), 1 (no pool yet: zeros), -1 (bad device).
NF_API int nf_torch_stats(int device, nf_stats_t *out);

//! Counters the pool does not keep, for PyTorch's "allocated"/"freed" stats:
//! out[0] bytes allocated, out[1] bytes freed (requested sizes, cumulative),
//! out[2] allocations, out[3] frees, out[4] failed allocations, out[5] those
//! refused by the memory fraction (OOMs that the pool's `ooms` does not count).
NF_API int nf_torch_counters(int device, uint64_t *out, int n);

//! torch.cuda.reset_accumulated_memory_stats.
NF_API void nf_torch_reset_counters(int device);

NF_API void nf_torch_reset_peaks(int device);

//! Set the configuration for pools created afterwards. Returns 0, or -1 when a
//! pool already exists or the string does not parse (see nf_torch_last_error).
NF_API int nf_torch_configure(const char *conf);

//! The pool's configuration string as in force (limit resolved) or "" when the
//! device has no pool. Written into buf; returns the length or -1.
NF_API int nf_torch_config_string(int device, char *buf, size_t len);

//! Tests only: destroy every pool (live blocks are dropped) so that another
//! configuration can be tried. Not safe while tensors are alive.
NF_API void nf_torch_shutdown(void);

NF_API const char *nf_torch_last_error(void);

//! This thread's status from its last hook call that reports one (alloc,
//! free_any, record_stream, set_fraction): NF_OK, or why it failed
//! (NF_ERR_OOM only for out of memory). The hooks keep PyTorch's void
//! signatures; the C++ adapter raises from this.
NF_API int nf_torch_last_status(void);

//! Let Python hand over the thrower when the dlopen look-up did not find it
//! (fn NULL: keep the current one). Returns 1 when a thrower is installed.
NF_API int nf_torch_set_thrower(void *fn);

//! Turn raising on allocation failure on (1) or off (0: return NULL); returns
//! the previous setting. Callers through ctypes (tests) must turn it off: a
//! C++ exception cannot cross into Python through ctypes (it aborts).
NF_API int nf_torch_set_throw(int enabled);

//! ---------------------------------------------------------------- layout
//! The Python package mirrors nf_stats_t with ctypes; these let its tests
//! prove the mirror matches this build field by field.
NF_API size_t nf_stats_size(void);

NF_API size_t nf_stats_offset(const char *field);

// ---- C++ adapter support (src/torch/adapter*.{h,cpp}, walk.c, ipc.c)
//! The plug-in's pool for `device`, created on first use when `create`
//! (NULL: bad device or the pool cannot be made; nf_torch_last_error says why).
NF_API nf_pool_t *nf_torch_pool_get(int device, int create);

//! nf_torch_alloc served from private pool `id` (nf_alloc_private).
NF_API void *nf_torch_alloc_private(size_t size, int device, void *stream, uint64_t id);

//! Let device `peer` read and write `device`'s pool (made if needed): what is
//! mapped now and later (nf_pool_add_peer). 0, or -1 (nf_torch_last_error).
NF_API int nf_torch_add_peer(int device, int peer);

//! nf_alloc_at on `device`'s pool (re-create a checkpoint's block at `addr` in
//! private pool `id`), counted in nf_torch_counters like nf_torch_alloc.
NF_API void *nf_torch_alloc_at(int device, uint64_t id, void *addr, size_t size, void *stream);

//! Free a live block of whichever device's pool holds it (the deleter knows
//! only the pointer); returns the device, or -1 (not a live nofrag block).
NF_API int nf_torch_free_any(void *ptr);

//! A segment of the snapshot walk: a maximal run of mapped granules.
typedef struct nf_torch_seg_s {
  uintptr_t addr;
  uint64_t size;
  uint64_t private_id; //!< private pool owning it (0: general)
  int large;           //!< large arena
} nf_torch_seg_t;
//! A block of the walk, clipped to the current segment. state: 0 free, 1 live, 2 freed but pending (record_stream).
typedef struct nf_torch_blk_s {
  uintptr_t addr;
  uint64_t size, req;
  int state;
  void *stream;
} nf_torch_blk_t;
//! Called with exactly one of seg / blk non-NULL: a segment, then its blocks in address order.
typedef void (*nf_torch_walk_fn)(void *ctx, const nf_torch_seg_t *seg, const nf_torch_blk_t *blk);
//! Walk the pool under its lock (fn must not call the pool). 0, or -1 on a NULL argument.
NF_API int nf_torch_walk(nf_pool_t *pool, nf_torch_walk_fn fn, void *ctx);
//! CUDA IPC (src/torch/ipc.c). Export: a text handle for live block `ptr`
//! of pool p (written into buf) and the fds it names (into fds; the caller
//! keeps them open until the block is freed, then closes them); *offset is
//! ptr's offset in what the importer maps. Import (another process): map the
//! handle's memory with backend be; *base is the start of that mapping
//! (add the exporter's offset); nf_ipc_close unmaps it. The importer needs
//! ptrace access to the exporter (pidfd_getfd); a refusal says so. An
//! exported block is never offloaded (nf_offload refuses it until it is freed).
typedef struct nf_ipc_map_s nf_ipc_map_t;
NF_API nf_status_t nf_ipc_export(nf_pool_t *p, const void *ptr, char *buf, size_t len, int *fds, size_t max_fds,
                                 size_t *nfds, uint64_t *offset);
NF_API nf_status_t nf_ipc_import(nf_backend_t *be, const char *handle, void **base, nf_ipc_map_t **out);
NF_API void nf_ipc_close(nf_ipc_map_t *m);
//! The backend of a pool (for nf_ipc_import in the device's pool).
NF_API nf_backend_t *nf_pool_backend(nf_pool_t *p);
// ---- end C++ adapter support

#endif
