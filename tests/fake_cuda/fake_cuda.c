// A stand-in libcuda.so.1 with only the driver's query entry points, for
// testing `nofrag doctor`'s reports on machines without a GPU
// (tests/test_doctor.sh puts its directory on LD_LIBRARY_PATH). What it
// reports comes from NF_FAKE_CUDA, 'key=value,...':
//   init=R      cuInit's result (default 0)
//   version=V   cuDriverGetVersion (default 13000)
//   devices=N   cuDeviceGetCount (default 1)
//   vmmK=0      device K lacks virtual memory management
//   fdK=0       device K lacks POSIX fd handles
//   hvmmK=0     device K lacks host memory through the VMM API
//   peer=0      no device reaches another (default 1)
// Every other entry point the library's CUDA backend loads exists but fails
// with CUDA_ERROR_NOT_SUPPORTED: the backend opens (cuInit, cuDeviceGet of the
// ordinal asked, the primary context) and a pool on it fails at its first
// VMM call (the allocation granularity).
#include "fake_opt.h"

int cuInit(unsigned flags) { (void)flags; return fake_opt("init", 0); }
int cuDriverGetVersion(int *v) { *v = fake_opt("version", 13000); return 0; }
int cuDeviceGetCount(int *n) { *n = fake_opt("devices", 1); return 0; }
int cuDeviceGet(int *d, int ordinal) {
  if (ordinal < 0 || ordinal >= fake_opt("devices", 1)) return 101; // CUDA_ERROR_INVALID_DEVICE
  *d = ordinal;
  return 0;
}
int cuDeviceGetName(char *name, int len, int d) { snprintf(name, (size_t)len, "Fake GPU %d", d); return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)80 << 30; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) {
  switch (attr) {
  case 75: *v = 9; break; // compute capability 9.0
  case 76: *v = 0; break;
  case 102: *v = fake_dev_opt("vmm", d, 1); break;
  case 103: *v = fake_dev_opt("fd", d, 1); break;
  case 145: *v = fake_dev_opt("hvmm", d, 1); break;
  default: *v = 0;
  }
  return 0;
}
int cuDeviceCanAccessPeer(int *can, int a, int b) { *can = a != b && fake_opt("peer", 1); return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int d) { *ctx = (void *)(size_t)(d + 1); return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuMemsetD32_v2(unsigned long long p, unsigned v, size_t n) { (void)p; (void)v; (void)n; return 1; }
int cuMemcpyDtoH_v2(void *h, unsigned long long p, size_t n) { (void)h; (void)p; (void)n; return 1; }
int cuGetErrorName(int r, const char **s) {
  *s = r == 100   ? "CUDA_ERROR_NO_DEVICE"
       : r == 101 ? "CUDA_ERROR_INVALID_DEVICE"
       : r == 801 ? "CUDA_ERROR_NOT_SUPPORTED"
                  : "CUDA_ERROR_FAKE";
  return 0;
}
int cuGetErrorString(int r, const char **s) { (void)r; *s = "(the stand-in driver of tests/fake_cuda)"; return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = NULL; return 0; }
// Each backend op exchanges the thread's capture mode (relaxed) and back.
int cuThreadExchangeStreamCaptureMode(int *mode) {
  static _Thread_local int cur;
  int old = cur;
  cur = *mode;
  *mode = old;
  return 0;
}

// The rest: present, never working (arguments ignored).
#define NOT_SUPPORTED(f) int f(void) { return 801; }
NOT_SUPPORTED(cuCtxSynchronize)
NOT_SUPPORTED(cuEventCreate)
NOT_SUPPORTED(cuEventDestroy_v2)
NOT_SUPPORTED(cuEventQuery)
NOT_SUPPORTED(cuEventRecord)
NOT_SUPPORTED(cuEventSynchronize)
NOT_SUPPORTED(cuMemAddressFree)
NOT_SUPPORTED(cuMemAddressReserve)
NOT_SUPPORTED(cuMemCreate)
NOT_SUPPORTED(cuMemExportToShareableHandle)
NOT_SUPPORTED(cuMemGetAllocationGranularity)
NOT_SUPPORTED(cuMemGetInfo_v2)
NOT_SUPPORTED(cuMemImportFromShareableHandle)
NOT_SUPPORTED(cuMemMap)
NOT_SUPPORTED(cuMemRelease)
NOT_SUPPORTED(cuMemSetAccess)
NOT_SUPPORTED(cuMemUnmap)
NOT_SUPPORTED(cuMemcpyAsync)
NOT_SUPPORTED(cuStreamGetCtx)
NOT_SUPPORTED(cuStreamIsCapturing)
NOT_SUPPORTED(cuStreamWaitEvent)
