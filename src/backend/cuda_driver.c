// The CUDA driver loaded at run time: dlopen "libcuda.so.1", then each entry
// point by cuGetProcAddress (dlsym of its versioned symbol as the fallback),
// once per process under pthread_once. Never unloaded: the runtime, PyTorch
// and other backends share the driver, and unloading it is unsafe.
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// Each entry: the name cuGetProcAddress takes (base name) and the exported
// symbol that base name resolves to for CUDA >= 12 (for the dlsym fallback).
static const struct {
  const char *base, *versioned;
  size_t off;
} cu_syms[] = {
#define S(f, v) {"cu" #f, v, offsetof(cu_fns_t, f)}
    S(Init, "cuInit"),
    S(DeviceGet, "cuDeviceGet"),
    S(DeviceCanAccessPeer, "cuDeviceCanAccessPeer"),
    S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    S(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    S(CtxSetCurrent, "cuCtxSetCurrent"),
    S(CtxGetCurrent, "cuCtxGetCurrent"),
    S(MemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
    S(MemGetInfo, "cuMemGetInfo_v2"),
    S(MemAddressReserve, "cuMemAddressReserve"),
    S(MemAddressFree, "cuMemAddressFree"),
    S(MemCreate, "cuMemCreate"),
    S(MemRelease, "cuMemRelease"),
    S(MemMap, "cuMemMap"),
    S(MemUnmap, "cuMemUnmap"),
    S(MemSetAccess, "cuMemSetAccess"),
    S(MemcpyAsync, "cuMemcpyAsync"),
    S(EventCreate, "cuEventCreate"),
    S(EventRecord, "cuEventRecord"),
    S(EventQuery, "cuEventQuery"),
    S(EventSynchronize, "cuEventSynchronize"),
    S(EventDestroy, "cuEventDestroy_v2"),
    S(StreamWaitEvent, "cuStreamWaitEvent"),
    S(StreamGetCtx, "cuStreamGetCtx"),
    S(StreamIsCapturing, "cuStreamIsCapturing"),
    S(CtxSynchronize, "cuCtxSynchronize"),
    S(GetErrorName, "cuGetErrorName"),
    S(GetErrorString, "cuGetErrorString"),
    S(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
    S(MemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
    S(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode"),
#undef S
};

typedef CUresult (*cu_get_proc_v2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*cu_get_proc_v1_t)(const char *, void **, int, uint64_t);

cu_fns_t nf__cu;                    // filled once
static nf_status_t cu_load_status;  // result of loading
static char cu_load_msg[256];       // message when loading failed
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(cu_load_msg, sizeof cu_load_msg,
             "libcuda.so.1 not found: no NVIDIA driver on this machine (%s)", e ? e : "dlopen failed");
    cu_load_status = NF_ERR_UNSUPPORTED;
    return;
  }
  // Never dlclose: the driver stays loaded for the life of the process (the
  // runtime, PyTorch and other backends share it; unloading it is unsafe).
  cu_get_proc_v2_t gp2 = (cu_get_proc_v2_t)dlsym(lib, "cuGetProcAddress_v2");
  cu_get_proc_v1_t gp1 = gp2 ? NULL : (cu_get_proc_v1_t)dlsym(lib, "cuGetProcAddress");
  for (size_t i = 0; i < sizeof cu_syms / sizeof cu_syms[0]; i++) {
    void *fn = NULL;
    // 12000: every entry point here exists at that version, and asking for it
    // yields the current (_v2) variants of cuMemGetInfo / cuEventDestroy ...
    if (gp2) {
      int qr = 0;
      if (gp2(cu_syms[i].base, &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &qr) != CUDA_SUCCESS) fn = NULL;
    } else if (gp1) {
      if (gp1(cu_syms[i].base, &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM) != CUDA_SUCCESS) fn = NULL;
    }
    if (!fn) fn = dlsym(lib, cu_syms[i].versioned);
    if (!fn) {
      snprintf(cu_load_msg, sizeof cu_load_msg,
               "libcuda.so.1 lacks %s: the NVIDIA driver is too old for the VMM API (need CUDA >= 11.x)",
               cu_syms[i].versioned);
      cu_load_status = NF_ERR_UNSUPPORTED;
      return;
    }
    memcpy((char *)&nf__cu + cu_syms[i].off, &fn, sizeof fn);
  }
  cu_load_status = NF_OK;
}

nf_status_t nf__cu_load(const char **msg) {
  pthread_once(&cu_once, cu_load);
  *msg = cu_load_msg;
  return cu_load_status;
}
