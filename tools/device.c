// `nofrag replay --device cuda[:N]`: the replay on a real GPU (the hooks of
// nf__replay_dev, replay.h). Each run gets a fresh CUDA backend (the
// library's, on the driver's VMM API), each trace stream a CUDA stream of its
// own (non-blocking; the trace's stream 0 is the legacy default stream, as
// PyTorch's is), and --verify's signature words go into device memory with
// cuMemsetD32Async on the block's stream and come back with
// cuMemcpyDtoHAsync on the same stream, then a wait: a word a wrong mapping
// changed is found at the block's free, as on the simulated device.
//
// The driver is loaded at run time, as the library loads it: the CLI builds
// and runs without CUDA, and says so when asked for a device without one.
#include "cli.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cu_res;    // CUresult
typedef void *cu_strm; // CUstream
typedef unsigned long long cu_ptr;

struct nfc_device_s {
  nf__replay_dev dev;
  int ordinal;
  uint64_t total;     // the device's memory (cuDeviceTotalMem)
  nf_backend_t *keep; // the first backend: holds the primary context current for the streams
  cu_strm *streams;
  size_t n_streams;
  uint64_t *pinned; // cuMemAllocHost'ed words for reads (n_pinned of them)
  size_t n_pinned;
  cu_res (*StreamCreate)(cu_strm *, unsigned);
  cu_res (*StreamDestroy)(cu_strm);
  cu_res (*StreamSynchronize)(cu_strm);
  cu_res (*MemsetD32Async)(cu_ptr, unsigned, size_t, cu_strm);
  cu_res (*MemcpyDtoHAsync)(void *, cu_ptr, size_t, cu_strm);
  cu_res (*MemAllocHost)(void **, size_t);
  cu_res (*MemFreeHost)(void *);
  cu_res (*CtxSynchronize)(void);
  cu_res (*GetErrorName)(cu_res, const char **);
  cu_res (*DeviceGet)(int *, int);
  cu_res (*DeviceTotalMem)(size_t *, int);
};

static const char *cu_err(const nfc_device *d, cu_res r) {
  const char *s = NULL;
  if (d->GetErrorName(r, &s) != 0 || !s) s = "CUDA_ERROR_UNKNOWN";
  return s;
}

static int dev_backend(void *ctx, uint64_t granule, nf_backend_t **out, uint64_t *capacity, char *err,
                       size_t errlen) {
  nfc_device *d = ctx;
  (void)granule; // the driver's granule; the pool checks a configured one against it
  if (nf_backend_cuda_create(out, d->ordinal) != NF_OK) {
    snprintf(err, errlen, "cuda:%d: %s", d->ordinal, nf_last_error());
    return -1;
  }
  *capacity = d->total;
  return 0;
}

static nf_stream_t dev_stream(void *ctx, size_t k, uint64_t raw) {
  nfc_device *d = ctx;
  (void)raw; // made at the open: NULL for the trace's stream 0
  return k < d->n_streams ? d->streams[k] : NULL;
}

static int dev_put(void *ctx, nf_stream_t s, void *ptr, size_t n, const uint64_t *off, const uint64_t *val, char *err,
                   size_t errlen) {
  nfc_device *d = ctx;
  for (size_t i = 0; i < n; i++) {
    cu_ptr a = (cu_ptr)(uintptr_t)ptr + off[i];
    cu_res r = d->MemsetD32Async(a, (unsigned)val[i], 1, s);
    if (r == 0) r = d->MemsetD32Async(a + 4, (unsigned)(val[i] >> 32), 1, s);
    if (r != 0) {
      snprintf(err, errlen, "cuMemsetD32Async at %p + %llu: %s", ptr, (unsigned long long)off[i], cu_err(d, r));
      return -1;
    }
  }
  return 0;
}

static int dev_get(void *ctx, nf_stream_t s, void *ptr, size_t n, const uint64_t *off, uint64_t *val, char *err,
                   size_t errlen) {
  nfc_device *d = ctx;
  if (n > d->n_pinned) {
    void *p = NULL;
    size_t want = n < 1024 ? 1024 : n;
    cu_res r = d->MemAllocHost(&p, want * sizeof(uint64_t));
    if (r != 0) { snprintf(err, errlen, "cuMemAllocHost of %zu words: %s", want, cu_err(d, r)); return -1; }
    if (d->pinned) d->MemFreeHost(d->pinned);
    d->pinned = p;
    d->n_pinned = want;
  }
  for (size_t i = 0; i < n; i++) {
    cu_res r = d->MemcpyDtoHAsync(&d->pinned[i], (cu_ptr)(uintptr_t)ptr + off[i], 8, s);
    if (r != 0) {
      snprintf(err, errlen, "cuMemcpyDtoHAsync from %p + %llu: %s", ptr, (unsigned long long)off[i], cu_err(d, r));
      return -1;
    }
  }
  cu_res r = d->StreamSynchronize(s);
  if (r != 0) { snprintf(err, errlen, "cuStreamSynchronize: %s", cu_err(d, r)); return -1; }
  memcpy(val, d->pinned, n * sizeof *val);
  return 0;
}

static int dev_drain(void *ctx, char *err, size_t errlen) {
  nfc_device *d = ctx;
  cu_res r = d->CtxSynchronize();
  if (r != 0) { snprintf(err, errlen, "cuCtxSynchronize: %s", cu_err(d, r)); return -1; }
  return 0;
}

int nfc_device_open(const char *spec, size_t n_streams, const uint64_t *raw, nfc_device **out, char *err,
                    size_t errlen) {
  *out = NULL;
  int ordinal = 0;
  if (strcmp(spec, "cuda") != 0) { // "cuda:N", N decimal digits only, 0..1023 (the pool's bound for `device`)
    const char *n = strncmp(spec, "cuda:", 5) == 0 ? spec + 5 : "";
    char *end = NULL;
    long v = *n >= '0' && *n <= '9' ? strtol(n, &end, 10) : -1;
    if (v < 0 || v > 1023 || !end || *end) {
      snprintf(err, errlen, "--device '%s': expected cuda or cuda:N (N a device ordinal, 0..1023)", spec);
      return -1;
    }
    ordinal = (int)v;
  }
  nfc_device *d = calloc(1, sizeof *d);
  if (!d || !(d->streams = calloc(n_streams ? n_streams : 1, sizeof *d->streams))) {
    free(d);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  d->ordinal = ordinal;
  d->n_streams = n_streams;
  // The library's backend first: it loads the driver, says why when there is
  // none, and makes the device's primary context current on this thread.
  if (nf_backend_cuda_create(&d->keep, ordinal) != NF_OK) {
    snprintf(err, errlen, "--device %s: %s", spec, nf_last_error());
    nfc_device_close(d);
    return -1;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); // loaded already: the same handle
  const nfc_sym syms[] = {
      {&d->StreamCreate, "cuStreamCreate"},        {&d->StreamDestroy, "cuStreamDestroy_v2"},
      {&d->StreamSynchronize, "cuStreamSynchronize"}, {&d->MemsetD32Async, "cuMemsetD32Async"},
      {&d->MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"}, {&d->MemAllocHost, "cuMemAllocHost_v2"},
      {&d->MemFreeHost, "cuMemFreeHost"},          {&d->CtxSynchronize, "cuCtxSynchronize"},
      {&d->GetErrorName, "cuGetErrorName"},      {&d->DeviceGet, "cuDeviceGet"},
      {&d->DeviceTotalMem, "cuDeviceTotalMem_v2"},
  };
  const char *missing = lib ? nfc_dlsyms(lib, syms, sizeof syms / sizeof syms[0]) : syms[0].name;
  if (missing) {
    snprintf(err, errlen, "--device %s: libcuda.so.1 lacks %s", spec, missing);
    nfc_device_close(d);
    return -1;
  }
  int cudev = 0;
  size_t total = 0;
  if (d->DeviceGet(&cudev, ordinal) == 0 && d->DeviceTotalMem(&total, cudev) == 0) d->total = total;
  for (size_t k = 0; k < n_streams; k++) {
    cu_res r = raw[k] ? d->StreamCreate(&d->streams[k], 1 /* CU_STREAM_NON_BLOCKING */) : 0;
    if (r != 0) {
      snprintf(err, errlen, "--device %s: cuStreamCreate: %s", spec, cu_err(d, r));
      nfc_device_close(d);
      return -1;
    }
  }
  d->dev = (nf__replay_dev){.ctx = d, .backend = dev_backend, .stream = dev_stream, .put = dev_put,
                            .get = dev_get, .drain = dev_drain};
  *out = d;
  return 0;
}

const nf__replay_dev *nfc_device_hooks(const nfc_device *d) { return &d->dev; }

const char *nfc_dlsyms(void *lib, const nfc_sym *syms, size_t n) {
  for (size_t i = 0; i < n; i++) {
    void *f = dlsym(lib, syms[i].name);
    if (!f) return syms[i].name;
    memcpy(syms[i].dst, &f, sizeof f);
  }
  return NULL;
}

void nfc_device_close(nfc_device *d) {
  if (!d) return;
  if (d->CtxSynchronize) d->CtxSynchronize();
  for (size_t k = 0; k < d->n_streams; k++)
    if (d->streams[k]) d->StreamDestroy(d->streams[k]);
  if (d->pinned) d->MemFreeHost(d->pinned);
  if (d->keep) nf_backend_destroy(d->keep);
  free(d->streams);
  free(d);
}
