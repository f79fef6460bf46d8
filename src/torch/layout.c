// The layout of nf_stats_t for the Python package, which mirrors it with
// ctypes (python/nofrag/_lib.py): its tests prove the mirror matches this
// build field by field. In the torch layer beside the plug-in's other ctypes
// entry points; declared in torch.h.
#include "torch/torch.h"

#include <stddef.h>
#include <string.h>

NF_API size_t nf_stats_size(void) { return sizeof(nf_stats_t); }

NF_API size_t nf_stats_offset(const char *field) {
  static const struct {
    const char *name;
    size_t off;
  } f[] = {
#define F(x) {#x, offsetof(nf_stats_t, x)}
      F(live), F(live_peak), F(live_rounded), F(live_rounded_peak), F(mapped), F(mapped_peak),
      F(physical), F(physical_peak), F(limit), F(granule), F(cached), F(live_blocks),
      F(largest_free_mapped), F(live_granules), F(allocs), F(frees), F(invalid_frees), F(ooms),
      F(reclaims), F(reclaimed_granules), F(cross_stream_reuses), F(calls), F(calls.va_reserve),
      F(calls.va_release), F(calls.create), F(calls.release), F(calls.map), F(calls.unmap),
      F(calls.set_access), F(calls.event_create), F(calls.event_record), F(calls.event_query),
      F(calls.event_sync), F(calls.stream_wait), F(calls.copy), F(backend_calls), F(fragmentation),
      F(spilled), F(spilled_peak), F(offloaded), F(offloaded_disk), F(host_physical), F(host_physical_peak),
      F(spills), F(offloads), F(prefetches), F(views), F(view_reuses), F(view_moves), F(view_evictions),
      F(units), F(units_made), F(units_unmapped), F(unit_splits), F(physical_created), F(physical_released),
      F(edges), F(edges_made), F(call_ns), F(call_ns.va_reserve), F(call_ns.va_release), F(call_ns.create),
      F(call_ns.release), F(call_ns.map), F(call_ns.unmap), F(call_ns.set_access), F(call_ns.event_create),
      F(call_ns.event_record), F(call_ns.event_query), F(call_ns.event_sync), F(call_ns.stream_wait), F(call_ns.copy),
      F(backend_ns),
#undef F
  };
  if (!field) return (size_t)-1;
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (strcmp(f[i].name, field) == 0) return f[i].off;
  return (size_t)-1;
}
