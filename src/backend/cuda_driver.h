// The CUDA backend's private header: the few driver types, enum values and
// struct layouts it uses (copied from the CUDA 13 cuda.h: they are part of
// the driver ABI and have not changed since CUDA 10.2; nothing includes
// <cuda.h>, so the library builds without CUDA), and the driver's entry
// points, loaded at run time by cuda_driver.c. cuda.c is the backend.
#ifndef NF_BACKEND_CUDA_DRIVER_H
#define NF_BACKEND_CUDA_DRIVER_H

#include "backend.h"

#include <stddef.h>

// ------------------------------------------------------------ driver ABI
// Copied from cuda.h (CUDA 13.0). Only what this file uses.
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_NOT_SUPPORTED = 801,
};

enum { CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 };
enum { CU_MEM_HANDLE_TYPE_NONE = 0x0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 0x1, CU_MEM_LOCATION_TYPE_HOST = 0x2 };
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 };
enum { CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1 };
enum { CU_EVENT_DISABLE_TIMING = 0x2 };
enum { CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0 }; // PyTorch uses the legacy default stream
enum { CU_STREAM_CAPTURE_MODE_RELAXED = 2 };

typedef struct {
  int type; // CUmemLocationType
  int id;
} CUmemLocation;

typedef struct {
  int type;                 // CUmemAllocationType
  int requestedHandleTypes; // CUmemAllocationHandleType
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct {
  CUmemLocation location;
  int flags; // CUmemAccess_flags
} CUmemAccessDesc;

// Layout guards: these sizes are what cuda.h gives on LP64.
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation layout");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");

// ------------------------------------------------------------ function table
typedef struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetCurrent)(CUcontext *);
  CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                        unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventQuery)(CUevent);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*StreamGetCtx)(CUstream, CUcontext *);
  CUresult (*StreamIsCapturing)(CUstream, int *); // CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated
  CUresult (*CtxSynchronize)(void);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
  CUresult (*ThreadExchangeStreamCaptureMode)(int *); // CUstreamCaptureMode: 0 global, 1 thread-local, 2 relaxed
} cu_fns_t;

// The driver's entry points, filled once by nf__cu_load (cuda_driver.c).
extern cu_fns_t nf__cu;
// Loads libcuda.so.1 and every entry point above, once per process (later
// calls return the first result). NF_OK, or NF_ERR_UNSUPPORTED with the
// reason in *msg (no driver, or one too old for the VMM API).
nf_status_t nf__cu_load(const char **msg);

#endif
