// CUDA backend: the backend vtable on the driver's virtual memory management
// API (cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess ...).
//
// The driver is loaded at run time (cuda_driver.c; its types in cuda_driver.h,
// this backend's private header) so that the library builds and its CPU tests run
// on machines without CUDA: nothing here includes <cuda.h>.
//
// Contexts: PyTorch (and the runtime API in general) works in the device's
// primary context, so every op makes that context current on the calling
// thread when it is not already (a thread that never touched CUDA has none).
// Whatever the caller had current -- another context, or none -- is restored
// afterwards, so we never leave foreign threads in a surprising state (a
// thread left with device 1's context would report device 1 as its current
// device). The one exception is nf_backend_cuda_create, which binds the
// primary context on a thread that has none, for plain C programs' own driver
// calls; the PyTorch plug-in creates its backends unbound
// (nf__backend_cuda_open): a pool made for device 1 on a thread that had not
// touched CUDA (set_per_process_memory_fraction(f, 1) first) would otherwise
// make device 1 that thread's current device.
//
// Capture mode: every op runs in relaxed stream-capture mode (and restores
// the thread's own after). A capture in global mode -- torch.cuda.graph's
// default -- forbids "potentially unsafe" calls on every other thread: an
// event synchronize there fails (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and
// invalidates the capture (H100, driver 580: 4,500 of 4,783 captures broken
// while another thread's host waits ran; 0 of 5,138 in relaxed mode). The
// pool never uses a stream that is being captured (no event call on it, no
// host wait while a capture it knows of runs), so relaxed is safe for every
// op. A pair of mode exchanges costs ~20 ns; an op, microseconds.
//
// Thread safety: the driver entry points are thread-safe; this file's only
// shared state is the function table (cuda_driver.c, filled once) and a
// per-backend "handle type not supported" flag (atomic).
#include "cuda_driver.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------ backend state
typedef struct {
  nf_backend_t base;
  CUdevice dev;
  int ordinal;
  CUcontext ctx;                 // the device's primary context (retained)
  atomic_int handle_type[2];     // per tier: requestedHandleTypes that works (-1 = untried)
  _Atomic uint64_t peers;        // other devices (ordinal bits) granted access by set_access (add_peer)
} cuda_be_t;

static cuda_be_t *CB(nf_backend_t *be) { return (cuda_be_t *)be; }

static const char *cu_name(CUresult r) {
  const char *s = NULL;
  if (!nf__cu.GetErrorName || nf__cu.GetErrorName(r, &s) != CUDA_SUCCESS || !s) return "CUDA_ERROR_UNKNOWN";
  return s;
}
static const char *cu_str(CUresult r) {
  const char *s = NULL;
  if (!nf__cu.GetErrorString || nf__cu.GetErrorString(r, &s) != CUDA_SUCCESS || !s) return "unknown error";
  return s;
}

// Map a driver error to a nofrag status and record the message
// "<call>: <CUDA_ERROR_NAME>: <driver text>".
static nf_status_t cu_fail(nf_backend_t *be, CUresult r, const char *call) {
  nf_status_t st = r == CUDA_ERROR_OUT_OF_MEMORY ? NF_ERR_OOM : NF_ERR_BACKEND;
  return nf__backend_fail(be, st, "%s: %s: %s", call, cu_name(r), cu_str(r));
}

// Make the primary context current; returns the context to restore
// (CTX_KEEP: ours was current already). A thread that had none gets none
// back: the runtime adopts a current context, so leaving ours would change
// that thread's current device (cudaGetDevice, torch.cuda.current_device)
// to this pool's. See the header comment.
// The op's scope also holds the thread's capture mode to restore (see the
// header comment; -1: the exchange failed, nothing to restore).
#define CTX_KEEP ((CUcontext)(uintptr_t)1)
typedef struct {
  CUcontext ctx;
  int mode;
} cu_scope_t;
static CUresult ctx_enter(cuda_be_t *c, cu_scope_t *sc) {
  CUcontext cur = NULL;
  sc->ctx = CTX_KEEP;
  sc->mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (nf__cu.ThreadExchangeStreamCaptureMode(&sc->mode) != CUDA_SUCCESS) sc->mode = -1;
  CUresult r = nf__cu.CtxGetCurrent(&cur);
  if (r == CUDA_SUCCESS && cur != c->ctx) {
    r = nf__cu.CtxSetCurrent(c->ctx);
    if (r == CUDA_SUCCESS) sc->ctx = cur; // NULL: unbind again afterwards
  }
  return r; // on failure the caller still calls ctx_leave
}
static void ctx_leave(cu_scope_t *sc) {
  if (sc->ctx != CTX_KEEP) (void)nf__cu.CtxSetCurrent(sc->ctx);
  if (sc->mode >= 0) (void)nf__cu.ThreadExchangeStreamCaptureMode(&sc->mode);
}

// Run one driver call with the primary context current. `what` is the call
// description used in the error message.
#define CU_CALL(be, what, call)                                                   \
  do {                                                                            \
    cu_scope_t sc_;                                                               \
    CUresult e_ = ctx_enter(CB(be), &sc_);                                        \
    CUresult r_ = e_ == CUDA_SUCCESS ? (call) : CUDA_SUCCESS;                     \
    ctx_leave(&sc_);                                                              \
    if (e_ != CUDA_SUCCESS) return cu_fail((be), e_, "cuCtxSetCurrent(primary)"); \
    if (r_ != CUDA_SUCCESS) return cu_fail((be), r_, (what));                     \
  } while (0)

static void fill_prop(cuda_be_t *c, nf_tier_t tier, int handle_type, CUmemAllocationProp *p) {
  memset(p, 0, sizeof *p);
  p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->requestedHandleTypes = handle_type;
  if (tier == NF_TIER_HOST) {
    p->location.type = CU_MEM_LOCATION_TYPE_HOST;
    p->location.id = 0; // ignored for HOST
  } else {
    p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = c->ordinal;
  }
}

// ------------------------------------------------------------ ops
static nf_status_t op_granularity(nf_backend_t *be, nf_tier_t tier, size_t *out) {
  cuda_be_t *c = CB(be);
  if (tier == NF_TIER_DISK) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "cuda backend: no disk tier");
  CUmemAllocationProp p;
  fill_prop(c, tier, CU_MEM_HANDLE_TYPE_NONE, &p);
  size_t g = 0;
  CU_CALL(be, tier == NF_TIER_HOST ? "cuMemGetAllocationGranularity(host)" : "cuMemGetAllocationGranularity(device)",
          nf__cu.MemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  *out = g;
  return NF_OK;
}

// Host tier capacity from /proc/meminfo (MemTotal, MemAvailable): what the
// driver can pin for CU_MEM_LOCATION_TYPE_HOST allocations at most.
static nf_status_t host_meminfo(nf_backend_t *be, uint64_t *total, uint64_t *avail) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return nf__backend_fail(be, NF_ERR_BACKEND, "cuda backend: cannot read /proc/meminfo");
  char line[256];
  unsigned long long t = 0, a = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long v;
    if (sscanf(line, "MemTotal: %llu kB", &v) == 1) t = v * 1024ull;
    else if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) a = v * 1024ull;
  }
  fclose(f);
  if (total) *total = t;
  if (avail) *avail = a;
  return NF_OK;
}

static nf_status_t op_capacity(nf_backend_t *be, nf_tier_t tier, uint64_t *total, uint64_t *free_bytes) {
  if (tier == NF_TIER_HOST) return host_meminfo(be, total, free_bytes);
  if (tier == NF_TIER_DISK) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "cuda backend: no disk tier");
  size_t f = 0, t = 0;
  CU_CALL(be, "cuMemGetInfo", nf__cu.MemGetInfo(&f, &t));
  if (total) *total = t;
  if (free_bytes) *free_bytes = f;
  return NF_OK;
}

static nf_status_t op_va_reserve(nf_backend_t *be, size_t size, size_t align, uintptr_t *out) {
  CUdeviceptr p = 0;
  char what[96];
  snprintf(what, sizeof what, "cuMemAddressReserve(%zu B, align %zu)", size, align);
  CU_CALL(be, what, nf__cu.MemAddressReserve(&p, size, align, 0, 0));
  *out = (uintptr_t)p;
  return NF_OK;
}

static nf_status_t op_va_release(nf_backend_t *be, uintptr_t va, size_t size) {
  char what[96];
  snprintf(what, sizeof what, "cuMemAddressFree(0x%llx, %zu B)", (unsigned long long)va, size);
  CU_CALL(be, what, nf__cu.MemAddressFree((CUdeviceptr)va, size));
  return NF_OK;
}

// cuMemCreate with a shareable (POSIX fd) handle type so that granules can
// later be exported for IPC; drivers or locations that refuse it (some
// virtualised setups, host-located memory on older drivers) get the plain
// handle type, and the choice is remembered per tier so the refused attempt
// costs one extra call once, not on every granule.
static nf_status_t op_mem_create(nf_backend_t *be, nf_tier_t tier, size_t size, nf_handle_t *out) {
  cuda_be_t *c = CB(be);
  if (tier == NF_TIER_DISK) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "cuda backend: no disk tier");
  int ti = tier == NF_TIER_HOST ? 1 : 0;
  cu_scope_t sc;
  CUresult r = ctx_enter(c, &sc);
  if (r != CUDA_SUCCESS) {
    ctx_leave(&sc);
    return cu_fail(be, r, "cuCtxSetCurrent(primary)");
  }
  int ht = atomic_load(&c->handle_type[ti]);
  CUmemAllocationProp p;
  CUmemGenericAllocationHandle h = 0;
  if (ht < 0) { // untried: POSIX fd first
    fill_prop(c, tier, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &p);
    r = nf__cu.MemCreate(&h, size, &p, 0);
    if (r == CUDA_SUCCESS) {
      atomic_store(&c->handle_type[ti], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    } else if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE) {
      fill_prop(c, tier, CU_MEM_HANDLE_TYPE_NONE, &p);
      r = nf__cu.MemCreate(&h, size, &p, 0);
      if (r == CUDA_SUCCESS) atomic_store(&c->handle_type[ti], CU_MEM_HANDLE_TYPE_NONE);
    }
  } else {
    fill_prop(c, tier, ht, &p);
    r = nf__cu.MemCreate(&h, size, &p, 0);
  }
  ctx_leave(&sc);
  if (r != CUDA_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "cuMemCreate(%zu B%s)", size, tier == NF_TIER_HOST ? ", host" : "");
    return cu_fail(be, r, what);
  }
  *out = (nf_handle_t)h;
  return NF_OK;
}

static nf_status_t op_mem_release(nf_backend_t *be, nf_handle_t h) {
  CU_CALL(be, "cuMemRelease", nf__cu.MemRelease((CUmemGenericAllocationHandle)h));
  return NF_OK;
}

static nf_status_t op_map(nf_backend_t *be, uintptr_t va, size_t size, nf_handle_t h) {
  char what[96];
  snprintf(what, sizeof what, "cuMemMap(0x%llx, %zu B)", (unsigned long long)va, size);
  CU_CALL(be, what, nf__cu.MemMap((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)h, 0));
  return NF_OK;
}

static nf_status_t op_unmap(nf_backend_t *be, uintptr_t va, size_t size) {
  char what[96];
  snprintf(what, sizeof what, "cuMemUnmap(0x%llx, %zu B)", (unsigned long long)va, size);
  CU_CALL(be, what, nf__cu.MemUnmap((CUdeviceptr)va, size));
  return NF_OK;
}

// Read/write for this device and its peers (add_peer) over a run of mapped
// granules. The core calls it once per contiguous run (the driver cost is per
// handle either way, but one call per run saves the per-call overhead).
static nf_status_t op_set_access(nf_backend_t *be, uintptr_t va, size_t size) {
  CUmemAccessDesc d[65];
  size_t n = 0;
  memset(d, 0, sizeof d);
  d[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d[n].location.id = CB(be)->ordinal;
  d[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (uint64_t m = atomic_load(&CB(be)->peers); m; m &= m - 1) {
    d[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d[n].location.id = __builtin_ctzll(m);
    d[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  char what[96];
  snprintf(what, sizeof what, "cuMemSetAccess(0x%llx, %zu B, %zu devices)", (unsigned long long)va, size, n);
  CU_CALL(be, what, nf__cu.MemSetAccess((CUdeviceptr)va, size, d, n));
  return NF_OK;
}

// Later set_access calls grant `device` too (the core re-grants what is mapped
// already). Refused when the driver says that device cannot reach this one's
// memory (no P2P path): copies must then go through cudaMemcpyPeer.
static nf_status_t op_add_peer(nf_backend_t *be, int device) {
  cuda_be_t *c = CB(be);
  if (device == c->ordinal) return NF_OK;
  if (device < 0 || device >= 64)
    return nf__backend_fail(be, NF_ERR_INVALID, "add_peer: device %d out of range 0..63", device);
  CUdevice pd = 0;
  int can = 0;
  char what[96];
  CUresult r = nf__cu.DeviceGet(&pd, device); // no context needed
  if (r == CUDA_ERROR_INVALID_DEVICE)
    return nf__backend_fail(be, NF_ERR_INVALID, "add_peer: no CUDA device %d", device);
  if (r != CUDA_SUCCESS) return cu_fail(be, r, "cuDeviceGet");
  snprintf(what, sizeof what, "cuDeviceCanAccessPeer(%d, %d)", device, c->ordinal);
  CU_CALL(be, what, nf__cu.DeviceCanAccessPeer(&can, pd, c->dev));
  if (!can)
    return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "add_peer: device %d cannot access device %d's memory (no P2P)",
                            device, c->ordinal);
  atomic_fetch_or(&c->peers, 1ull << device);
  return NF_OK;
}

static nf_status_t op_copy(nf_backend_t *be, uintptr_t dst, uintptr_t src, size_t size, nf_stream_t s) {
  char what[96];
  snprintf(what, sizeof what, "cuMemcpyAsync(%zu B)", size);
  CU_CALL(be, what, nf__cu.MemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, (CUstream)s));
  return NF_OK;
}

static nf_status_t op_event_create(nf_backend_t *be, nf_event_t *out) {
  CUevent e = NULL;
  CU_CALL(be, "cuEventCreate", nf__cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  *out = (nf_event_t)e;
  return NF_OK;
}

static nf_status_t op_event_destroy(nf_backend_t *be, nf_event_t ev) {
  CU_CALL(be, "cuEventDestroy", nf__cu.EventDestroy((CUevent)ev));
  return NF_OK;
}

static nf_status_t op_event_record(nf_backend_t *be, nf_event_t ev, nf_stream_t s) {
  CU_CALL(be, "cuEventRecord", nf__cu.EventRecord((CUevent)ev, (CUstream)s));
  return NF_OK;
}

static nf_status_t op_event_query(nf_backend_t *be, nf_event_t ev) {
  cu_scope_t sc;
  CUresult e = ctx_enter(CB(be), &sc), r = e == CUDA_SUCCESS ? nf__cu.EventQuery((CUevent)ev) : CUDA_SUCCESS;
  ctx_leave(&sc);
  if (e != CUDA_SUCCESS) return cu_fail(be, e, "cuCtxSetCurrent(primary)");
  if (r == CUDA_SUCCESS) return NF_OK;
  if (r == CUDA_ERROR_NOT_READY) return NF_ERR_NOT_READY; // not an error: no message
  return cu_fail(be, r, "cuEventQuery");
}

static nf_status_t op_event_sync(nf_backend_t *be, nf_event_t ev) {
  CU_CALL(be, "cuEventSynchronize", nf__cu.EventSynchronize((CUevent)ev));
  return NF_OK;
}

static nf_status_t op_stream_wait(nf_backend_t *be, nf_stream_t s, nf_event_t ev) {
  CU_CALL(be, "cuStreamWaitEvent", nf__cu.StreamWaitEvent((CUstream)s, (CUevent)ev, 0));
  return NF_OK;
}

// The pool's events are made in the primary context, and CUDA records an
// event only on a stream of the event's context: a stream of another device
// (or of a context the caller made) is refused when the pool first sees it,
// not at a record in some later free. NULL and the legacy / per-thread
// handles name the current context's stream, which is ours for every call.
static nf_status_t op_stream_check(nf_backend_t *be, nf_stream_t s) {
  if ((uintptr_t)s <= 2) return NF_OK;
  CUcontext ctx = NULL;
  CUresult r = nf__cu.StreamGetCtx((CUstream)s, &ctx);
  if (r != CUDA_SUCCESS)
    return nf__backend_fail(be, NF_ERR_INVALID, "cuStreamGetCtx: %s: %s (not a valid stream?)", cu_name(r), cu_str(r));
  if (ctx != CB(be)->ctx)
    return nf__backend_fail(be, NF_ERR_INVALID,
                            "the stream belongs to another CUDA context than device %d's primary one (another "
                            "device's stream?): events of the pool cannot be recorded on it", CB(be)->ordinal);
  return NF_OK;
}

static nf_status_t op_stream_capturing(nf_backend_t *be, nf_stream_t s, int *capturing) {
  int status = 0;
  CU_CALL(be, "cuStreamIsCapturing", nf__cu.StreamIsCapturing((CUstream)s, &status));
  *capturing = status != 0; // an invalidated capture is still one: no host wait on it
  return NF_OK;
}

static nf_status_t op_sync(nf_backend_t *be) {
  CU_CALL(be, "cuCtxSynchronize", nf__cu.CtxSynchronize());
  return NF_OK;
}

static void op_destroy(nf_backend_t *be) {
  cuda_be_t *c = CB(be);
  if (!c) return;
  // Release our reference on the primary context; PyTorch holds its own, so
  // this never tears the context down under it.
  if (c->ctx) (void)nf__cu.DevicePrimaryCtxRelease(c->dev);
  free(c);
}

// Sharing with another process (src/torch/ipc.c): granules are created with
// POSIX-fd handles where the driver allows (op_mem_create), so they export as
// an fd; without that the driver refuses and the message says so.
static nf_status_t op_mem_export(nf_backend_t *be, nf_handle_t h, int *fd, uint64_t *off) {
  *off = 0;
  CU_CALL(be, "cuMemExportToShareableHandle(POSIX fd)",
          nf__cu.MemExportToShareableHandle(fd, (CUmemGenericAllocationHandle)h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return NF_OK;
}

static nf_status_t op_mem_import(nf_backend_t *be, int fd, uint64_t off, size_t size, nf_handle_t *out) {
  (void)size;
  if (off) return nf__backend_fail(be, NF_ERR_INVALID, "cuda backend: mem_import: offset %llu (a CUDA fd is one allocation)",
                                   (unsigned long long)off);
  CUmemGenericAllocationHandle h = 0;
  CU_CALL(be, "cuMemImportFromShareableHandle(POSIX fd)",
          nf__cu.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  *out = (nf_handle_t)h;
  return NF_OK;
}

static const nf_backend_ops_t cuda_ops = {
    .name = "cuda",
    .granularity = op_granularity,
    .capacity = op_capacity,
    .va_reserve = op_va_reserve,
    .va_release = op_va_release,
    .mem_create = op_mem_create,
    .mem_release = op_mem_release,
    .map = op_map,
    .unmap = op_unmap,
    .set_access = op_set_access,
    .add_peer = op_add_peer,
    .copy = op_copy,
    .event_create = op_event_create,
    .event_destroy = op_event_destroy,
    .event_record = op_event_record,
    .event_query = op_event_query,
    .event_sync = op_event_sync,
    .stream_wait = op_stream_wait,
    .stream_check = op_stream_check,
    .stream_capturing = op_stream_capturing,
    .sync = op_sync,
    .destroy = op_destroy,
    .mem_export = op_mem_export,
    .mem_import = op_mem_import,
};


static nf_status_t create_fail(nf_status_t st, CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return nf__error(st, "%s", call);
  return nf__error(st, "%s: %s: %s", call, cu_name(r), cu_str(r));
}

nf_status_t nf__backend_cuda_open(nf_backend_t **out, int device, bool bind) {
  if (!out) return NF_ERR_INVALID;
  *out = NULL;
  if (device < 0) return create_fail(NF_ERR_INVALID, CUDA_SUCCESS, "cuda backend: negative device ordinal");
  const char *load_msg;
  nf_status_t ls = nf__cu_load(&load_msg);
  if (ls != NF_OK) return create_fail(ls, CUDA_SUCCESS, load_msg);

  CUresult r = nf__cu.Init(0);
  if (r != CUDA_SUCCESS) {
    // No GPU / driver unusable in this container: unsupported here, not a bug.
    nf_status_t st = (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_INSUFFICIENT_DRIVER ||
                      r == CUDA_ERROR_STUB_LIBRARY || r == CUDA_ERROR_NOT_INITIALIZED)
                         ? NF_ERR_UNSUPPORTED
                         : NF_ERR_BACKEND;
    return create_fail(st, r, "cuInit");
  }
  CUdevice dev = 0;
  r = nf__cu.DeviceGet(&dev, device);
  if (r != CUDA_SUCCESS) {
    char what[64];
    snprintf(what, sizeof what, "cuDeviceGet(%d)", device);
    return create_fail(r == CUDA_ERROR_INVALID_DEVICE ? NF_ERR_INVALID : NF_ERR_BACKEND, r, what);
  }
  cuda_be_t *c = calloc(1, sizeof *c);
  if (!c) return create_fail(NF_ERR_NOMEM, CUDA_SUCCESS, "cuda backend: out of host memory");
  c->base.ops = &cuda_ops;
  c->dev = dev;
  c->ordinal = device;
  atomic_init(&c->handle_type[0], -1);
  atomic_init(&c->handle_type[1], -1);
  atomic_init(&c->peers, 0);
  r = nf__cu.DevicePrimaryCtxRetain(&c->ctx, dev);
  if (r != CUDA_SUCCESS) {
    free(c);
    return create_fail(NF_ERR_BACKEND, r, "cuDevicePrimaryCtxRetain");
  }
  // A thread without any context (a plain C program) gets the primary one,
  // so that its own later driver calls (e.g. cuMemcpy in tests) work too.
  CUcontext cur = NULL;
  if (bind && nf__cu.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL) (void)nf__cu.CtxSetCurrent(c->ctx);
  *out = &c->base;
  return NF_OK;
}

nf_status_t nf_backend_cuda_create(nf_backend_t **out, int device) { return nf__backend_cuda_open(out, device, true); }
