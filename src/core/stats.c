// Statistics and the invariant checker (the checker is what the randomized
// tests lean on: it re-derives every counter from the structures).
#include "core/core.h"

#include <stdlib.h>
#include <string.h>


void nf_stats_get(nf_pool_t *p, nf_stats_t *out) {
  if (!p || !out) {
    if (out) memset(out, 0, sizeof *out);
    nf__error(NF_ERR_INVALID, "nofrag: nf_stats_get: NULL argument");
    return;
  }
  nf__pool_lock(p);
  nf_stats_t s = p->st;
  s.mapped = p->gran_mapped << p->gshift;
  s.physical = p->gran_created << p->gshift;
  s.limit = p->cfg.limit;
  s.granule = p->granule;
  s.cached = nf__cached(p);
  s.largest_free_mapped = nf__largest_free_mapped(p, &s.live_granules);
  if (p->pub_lf_stale) { p->pub_lf_ns = 0; nf__pub_full(p); } // the monitor gets a fresh walk too
  s.backend_calls = nf__calls_total(&s.calls);
  s.backend_ns = nf__calls_total(&s.call_ns);
  s.spilled = (p->host_mapped - p->offl_granules) << p->gshift;
  s.offloaded = (p->offl_granules + p->detached_granules) << p->gshift;
  s.offloaded_disk = p->disk_bytes;
  s.host_physical = p->host_created << p->gshift;
  s.physical_created = p->gran_made << p->gshift;
  s.physical_released = (p->gran_made - p->gran_created) << p->gshift;
  s.views = p->vw_count;
  s.view_reuses = p->vw_reuses;
  s.view_moves = p->vw_transfers;
  s.units = p->un_live;
  s.units_made = p->un_made;
  s.edges = p->edge_live;
  s.edges_made = p->edge_made;
  s.units_unmapped = p->un_gone;
  s.unit_splits = p->un_split;
  s.view_evictions = p->vw_evicted;
  // Live bytes whose granules are unmapped (disk / detached offloads) are not
  // part of what is mapped: leave them out.
  uint64_t away = p->away_granules << p->gshift, resident = s.live > away ? s.live - away : 0;
  s.fragmentation = s.mapped ? 1.0 - (double)resident / (double)s.mapped : 0.0;
  nf__pool_unlock(p);
  *out = s;
}

void nf_stats_reset_peaks(nf_pool_t *p) {
  if (!p) { nf__error(NF_ERR_INVALID, "nofrag: nf_stats_reset_peaks: NULL pool"); return; }
  nf__pool_lock(p);
  p->st.live_peak = p->st.live;
  p->st.live_rounded_peak = p->st.live_rounded;
  p->st.mapped_peak = p->gran_mapped << p->gshift;
  p->st.physical_peak = p->gran_created << p->gshift;
  p->st.spilled_peak = (p->host_mapped - p->offl_granules) << p->gshift;
  p->st.host_physical_peak = p->host_created << p->gshift;
  nf__pub_full(p); // the monitor's peaks too
  nf__pool_unlock(p);
}

#define CHECK(cond, ...) do { if (!(cond)) { st = nf__error(NF_ERR_INVALID, __VA_ARGS__); goto out; } } while (0)

nf_status_t nf_pool_check(nf_pool_t *p) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_pool_check: NULL pool");
  nf__pool_lock(p);
  nf_status_t st = NF_OK;
  uint64_t live = 0, live_r = 0, nlive = 0, norphans = 0, mapped = 0, nfree_blocks = 0, tlsf_blocks = 0, nd = 0, nhost = 0;
  uint64_t nguest = 0, nshadow = 0, npaired = 0; // edge sharing (edge.c)
  uint8_t *seen = calloc(p->gran_cap ? p->gran_cap : 1, 1); // physical granule mapped once at most
  CHECK(seen, "check: out of memory");
  for (nf_chunk_t *c = p->chunks; c; c = c->next) {
    uintptr_t at = c->base;
    const nf_block_t *prev = NULL;
    for (const nf_block_t *b = c->first; b; prev = b, b = b->next) {
      CHECK(b->addr == at, "check: block at %p, expected %p (gap or overlap)", (void *)b->addr, (void *)at);
      CHECK(b->prev == prev && b->chunk == c, "check: broken links at %p", (void *)b->addr);
      CHECK(b->size && !(b->size & (NF_ALIGN - 1)), "check: bad size %llu", (unsigned long long)b->size);
      at += b->size;
      // Free neighbours coalesce, except where one is parked (bins: merged at the flush).
      CHECK(!(b->state == NF_BLK_FREE && prev && prev->state == NF_BLK_FREE && !b->parked && !prev->parked),
            "check: free blocks %p and %p are adjacent, not coalesced", (void *)prev->addr, (void *)b->addr);
      if (b->state == NF_BLK_FREE) { nfree_blocks++; continue; }
      if (b->state == NF_BLK_SHADOW) { // its pair is checked from its guest granule (nf__edge_check)
        CHECK(b->twin && b->twin->twin == b && (b->edge & (NF_EDGE_GUEST | NF_EDGE_HOST)) &&
                  (b->twin->edge ^ b->edge) == (NF_EDGE_GUEST | NF_EDGE_HOST),
              "check: shadow block %p is not paired", (void *)b->addr);
        nshadow++;
        continue;
      }
      CHECK(b->state == NF_BLK_LIVE || b->state == NF_BLK_PENDING, "check: block %p in bad state %u", (void *)b->addr,
            (unsigned)b->state);
      CHECK(!(b->edge & ~(NF_EDGE_HEAD | NF_EDGE_TAIL)), "check: block %p: bad edge mark", (void *)b->addr);
      npaired += (b->edge & NF_EDGE_HEAD) + (b->edge >> 1 & 1);
      // A live or pending block's streams hold their slots (streams_recycle),
      // but a live one's allocation stream may have lost its slot (streams_steal).
      if (b->stream == NF_STREAM_ORPHAN) {
        CHECK(b->state == NF_BLK_LIVE && !b->where, "check: block %p without a stream slot is not live on the device",
              (void *)b->addr);
        norphans++;
      } else {
        CHECK(b->stream < p->nstreams && !(1ull << b->stream & p->stream_free),
              "check: block %p names a stream slot given back", (void *)b->addr);
      }
      CHECK(!(b->extra & p->stream_free), "check: block %p names a stream slot given back", (void *)b->addr);
      uint64_t o0, o1;
      if (b->state == NF_BLK_LIVE && p->tier.away && p->tier.away(p, b) && nf__owned(p, b, &o0, &o1)) {
        // Disk- or detached-offloaded: the owned granules are unmapped (or, where a failed prefetch's unmap
        // failed too, mapped without access: cache for the next prefetch), the edges ready.
        for (uint64_t g = o0; g < o1; g++)
          CHECK(!nf__bit(c->mapped, g) || !nf__bit(NF_READY(c), g), "check: offloaded (unmapped) block %p still mapped",
                (void *)b->addr);
        nd += o1 - o0;
        CHECK(nf__range_mapped(p, c, b->addr, (o0 << p->gshift) + c->base - b->addr) &&
                  nf__range_mapped(p, c, c->base + (o1 << p->gshift), b->addr + b->size - c->base - (o1 << p->gshift)),
              "check: edges of offloaded (unmapped) block %p not mapped", (void *)b->addr);
      } else if (b->state == NF_BLK_LIVE) { // pending blocks hold no data (a disk-offloaded one is unmapped)
        // A failed tier operation may leave granules of it mapped without access (a state the error reports,
        // until its nf_prefetch): then it is marked, so that its free does not park it (nf_block_t.unready).
        bool ready = nf__range_mapped(p, c, b->addr, b->size), held = true;
        for (uint64_t g = (b->addr - c->base) >> p->gshift; g << p->gshift < b->addr + b->size - c->base; g++)
          held = held && nf__bit(c->mapped, g);
        CHECK(ready || (b->unready && held), "check: live block %p not fully mapped%s", (void *)b->addr,
              b->unready ? "" : " (nor marked as left without access by a failed tier operation)");
        CHECK(!ready || !b->unready, "check: live block %p marked as without access, but ready", (void *)b->addr);
      }
      if (b->state == NF_BLK_LIVE) {
        CHECK(nf__map_find(p, b->addr) == b, "check: live block %p missing from the hash", (void *)b->addr);
        CHECK(b->req && b->req <= b->size && b->size - b->req < NF_ALIGN, "check: size %llu vs request %llu",
              (unsigned long long)b->size, (unsigned long long)b->req);
        live += b->req; live_r += b->size; nlive++;
      }
    }
    CHECK(at == c->base + c->size, "check: blocks do not cover the range");
    const uint64_t *ready = c->mapped + ((c->ngran + 63) >> 6);
    for (uint64_t g = 0; g < c->ngran; g++) {
      bool m = c->mapped[g >> 6] >> (g & 63) & 1, r = ready[g >> 6] >> (g & 63) & 1;
      CHECK(m || !r, "check: granule ready but not mapped");
      CHECK(m || !nf__guest(c, g), "check: shared granule not mapped");
      if (!m) continue;
      if (nf__guest(c, g)) { // a second mapping of a granule owned elsewhere
        if ((st = nf__edge_check(p, c, g)) != NF_OK) goto out;
        nguest++;
        continue;
      }
      mapped++;
      uint32_t i = c->phys[g];
      CHECK(i < p->gran_cap && p->gran[i].state == NF_GR_MAPPED, "check: mapped granule %u in bad state", i);
      CHECK(!seen[i], "check: physical granule %u mapped twice", i);
      seen[i] = 1;
      nhost += p->gran[i].tier == NF_TIER_HOST;
    }
  }
  for (int a = 0; a < NF_ARENA_COUNT; a++)
    for (int f = 0; f < NF_FL_COUNT; f++)
      for (int s = 0; s < NF_SL_COUNT; s++)
        for (const nf_block_t *b = p->tlsf[a].heads[f][s]; b; b = b->fnext) {
          CHECK(b->state == NF_BLK_FREE && b->arena == a && !b->parked, "check: non-free block in the free index");
          tlsf_blocks++;
        }
  for (int a = 0; a < NF_ARENA_COUNT; a++) // the general index holds no private block
    for (int f = 0; f < NF_FL_COUNT; f++)
      for (int s = 0; s < NF_SL_COUNT; s++)
        for (const nf_block_t *b = p->tlsf[a].heads[f][s]; b; b = b->fnext)
          CHECK(!b->chunk->priv, "check: private block %p in the general free index", (void *)b->addr);
  tlsf_blocks += nf__priv_check(p, &st);
  if (st != NF_OK) goto out;
  uint64_t nparked = 0, parked_bytes = 0; // bins: parked blocks are free, mapped, general, of the bin's size
  for (uint32_t i = 0; i < NF_BINS; i++) {
    const nf_bin_t *bin = &p->bins[i];
    uint32_t n = 0;
    for (const nf_block_t *b = bin->head, *prev = NULL; b; prev = b, b = b->fnext, n++) {
      CHECK(b->state == NF_BLK_FREE && b->parked && b->fprev == prev && !b->chunk->priv &&
                b->size == bin->units << NF_ALIGN_SHIFT && nf__bin_of(bin->units) == i,
            "check: bad parked block %p in bin %u", (void *)b->addr, i);
      CHECK(nf__range_mapped(p, b->chunk, b->addr, b->size) || p->vw_on,
            "check: parked block %p not fully mapped", (void *)b->addr);
      parked_bytes += b->size;
    }
    CHECK(n == bin->n && n <= NF_BIN_MAX, "check: bin %u holds %u blocks, counter %u", i, n, bin->n);
    for (const nf_block_t *b = bin->head; b; b = b->fnext)
      CHECK((b->arena == NF_ARENA_SMALL) == (b != p->bin_large), "check: large parked block %p not the one", (void *)b->addr);
    nparked += n;
  }
  CHECK(nparked == p->bin_blocks && parked_bytes == p->bin_bytes, "check: bins hold %llu blocks (%llu B), counters %llu (%llu B)",
        (unsigned long long)nparked, (unsigned long long)parked_bytes, (unsigned long long)p->bin_blocks,
        (unsigned long long)p->bin_bytes);
  CHECK(!p->bin_large || p->bin_large->parked, "check: bin_large not parked");
  tlsf_blocks += nparked;
  CHECK(tlsf_blocks == nfree_blocks, "check: %llu free blocks, %llu indexed",
        (unsigned long long)nfree_blocks, (unsigned long long)tlsf_blocks);
  CHECK(live == p->st.live && live_r == p->st.live_rounded && nlive == p->st.live_blocks,
        "check: live counters %llu/%llu/%llu, walk %llu/%llu/%llu", (unsigned long long)p->st.live,
        (unsigned long long)p->st.live_rounded, (unsigned long long)p->st.live_blocks,
        (unsigned long long)live, (unsigned long long)live_r, (unsigned long long)nlive);
  CHECK(norphans == p->orphans, "check: %llu blocks without a stream slot, %llu counted",
        (unsigned long long)norphans, (unsigned long long)p->orphans);
  CHECK(nlive + p->bin_blocks == p->map.count, "check: hash holds %llu, live %llu + parked %llu",
        (unsigned long long)p->map.count, (unsigned long long)nlive, (unsigned long long)p->bin_blocks);
  CHECK(!p->last || p->last->state != NF_BLK_LIVE || nf__map_find(p, p->last->addr) == p->last,
        "check: nf_free's guess %p is a live block the map does not name", (void *)p->last->addr);
  CHECK(nguest == p->edge_live && npaired == nguest && nshadow == 2 * nguest,
        "check: %llu shared granules, %llu paired blocks, %llu shadows; %llu pairs counted", (unsigned long long)nguest,
        (unsigned long long)npaired, (unsigned long long)nshadow, (unsigned long long)p->edge_live);
  CHECK(mapped == p->gran_mapped, "check: mapped bits %llu, counter %llu", (unsigned long long)mapped,
        (unsigned long long)p->gran_mapped);
  CHECK(nhost == p->host_mapped && p->offl_granules <= nhost, "check: host granules mapped %llu, counter %llu",
        (unsigned long long)nhost, (unsigned long long)p->host_mapped);
  CHECK(nd == p->away_granules, "check: unmapped live granules %llu, counter %llu", (unsigned long long)nd,
        (unsigned long long)p->away_granules);
  uint64_t nfree = 0, hfree = 0;
  for (int32_t i = p->gran_free; i >= 0; i = p->gran[i].next_free) {
    CHECK(p->gran[i].state == NF_GR_FREE && !seen[i] && p->gran[i].tier == NF_TIER_DEVICE,
          "check: free-list granule %d in bad state", i);
    seen[i] = 1;
    nfree++;
  }
  for (int32_t i = p->host_free; i >= 0; i = p->gran[i].next_free) {
    CHECK(p->gran[i].state == NF_GR_FREE && !seen[i] && p->gran[i].tier == NF_TIER_HOST,
          "check: host free-list granule %d in bad state", i);
    seen[i] = 1;
    hfree++;
  }
  CHECK(nfree == p->gran_free_count && hfree == p->host_free_count, "check: free counts");
  if (p->tier.check && (st = p->tier.check(p, seen)) != NF_OK) goto out;
  if ((st = nf__view_check(p)) != NF_OK) goto out;
  uint64_t loose = 0;
  if ((st = nf__unit_check(p, &loose)) != NF_OK) goto out;
  CHECK(nfree + hfree + mapped + loose + (p->tier.staged ? p->tier.staged(p) : 0) + p->detached_granules == p->gran_created + p->host_created,
        "check: granules created %llu + %llu host != free %llu + %llu host + mapped %llu + in copies %llu + "
        "detached %llu", (unsigned long long)p->gran_created, (unsigned long long)p->host_created,
        (unsigned long long)nfree, (unsigned long long)hfree, (unsigned long long)mapped,
        (unsigned long long)(p->tier.staged ? p->tier.staged(p) : 0), (unsigned long long)p->detached_granules);
  CHECK(live_r <= ((mapped + nd) << p->gshift), "check: live exceeds mapped (+ on disk)");
out:
  free(seen);
  nf__pool_unlock(p);
  return st;
}
