// `nofrag replay --html FILE`: one self-contained page (no network) with a
// live-vs-reserved timeline per allocator run and the peak marked.
//
// The data go into the page as JSON and inline JavaScript draws SVG, so the
// file stays small (about 2000 samples per series, whatever the trace
// length) and opens anywhere. When the script has drawn every chart it sets
// <body data-drawn="N">, which the test reads back from headless Chromium.
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t nfc_html_every(size_t n_ops) { return n_ops / 2000 + 1; }

static int push(nfc_html_series *s, uint64_t x, uint64_t live, uint64_t reserved) {
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 2048;
    uint64_t *nx = realloc(s->x, nc * sizeof *nx);
    if (nx) s->x = nx;
    uint64_t *nl = realloc(s->live, nc * sizeof *nl);
    if (nl) s->live = nl;
    uint64_t *nr = realloc(s->reserved, nc * sizeof *nr);
    if (nr) s->reserved = nr;
    if (!nx || !nl || !nr) return -1;
    s->cap = nc;
  }
  s->x[s->n] = x;
  s->live[s->n] = live;
  s->reserved[s->n++] = reserved;
  return 0;
}

void nfc_html_sample(void *ctx, size_t op, const nf_stats_t *st) {
  nfc_html_series *s = ctx;
  // The pool's cumulative peaks tell where a true peak fell even when it lies
  // between two samples: a peak that rose since the last sample is the
  // maximum over that interval, so the point carries it (else the value now).
  // The line then reaches the table's peak live and peak physical exactly.
  uint64_t live = st->live_peak > s->live_peak_seen ? st->live_peak : st->live, res = st->physical;
  s->live_peak_seen = st->live_peak;
  if (st->physical_peak > s->peak_reserved) { res = s->peak_reserved = st->physical_peak; s->peak_x = op; }
  (void)push(s, op, live, res); // out of memory: the chart just gets fewer points
}

void nfc_html_model_sample(void *ctx, size_t op, uint64_t live, uint64_t reserved) {
  (void)push(ctx, op, live, reserved); // out of memory: fewer points
}

int nfc_html_trace_series(const nf_trace_t *t, const nf__trace_ops *ops, size_t every, nfc_html_series *out) {
  memset(out, 0, sizeof *out);
  out->name = "PyTorch native, recorded in the trace";
  out->reserved_label = "reserved (segments)";
  // Running sums over the events; sampled after the event of every
  // `every`-th op, so the x axis matches the replay's.
  // Each point is the maximum over its interval, so short spikes (the live
  // peak) stay visible however long the trace.
  // Segment sizes as nf__trace_ops_build counts them (a segment_free
  // counts the size recorded at its segment_alloc, and sums saturate), so
  // the chart's peak is the table's and --json's native peak reserved;
  // segment events after the last op still count.
  uint64_t *segsz = nf__trace_segment_sizes(t);
  if (!segsz) return -1;
  size_t k = 0, done = 0;
  uint64_t live = 0, seg = 0, peak = 0, peak_x = 0, max_live = 0, max_seg = 0;
  for (size_t e = 0; e < t->n_events; e++) {
    const nf_trace_event_t *ev = &t->events[e];
    if (ev->action == NF_TRACE_SEGMENT_ALLOC) seg = segsz[e] > UINT64_MAX - seg ? UINT64_MAX : seg + segsz[e];
    else if (ev->action == NF_TRACE_SEGMENT_FREE) seg = seg >= segsz[e] ? seg - segsz[e] : 0;
    // Reached during the op the segment was made for (it precedes that op's
    // alloc event): counted as the models count it, ops done with that one.
    if (seg > peak) { peak = seg; peak_x = done < ops->n_ops ? done + 1 : done; }
    if (seg > max_seg) max_seg = seg;
    if (k >= ops->n_ops || ops->ops[k].event != e) continue;
    if (ops->ops[k].kind == NF_TRACE_OP_ALLOC) live += ops->ops[k].size;
    else live = live >= ops->ops[k].size ? live - ops->ops[k].size : 0;
    done = ++k;
    if (live > max_live) max_live = live;
    if (done % every == 0 || done == ops->n_ops) {
      if (push(out, done, max_live, max_seg) != 0) { free(segsz); return -1; }
      max_live = live;
      max_seg = seg;
    }
  }
  free(segsz);
  // Segment events after the last op belong to the last point's interval.
  if (out->n && max_seg > out->reserved[out->n - 1]) out->reserved[out->n - 1] = max_seg;
  out->peak_reserved = peak;
  out->peak_x = peak_x;
  return 0;
}

void nfc_html_series_free(nfc_html_series *s) {
  free(s->x);
  free(s->live);
  free(s->reserved);
  memset(s, 0, sizeof *s);
}

static void json_arr(FILE *f, const uint64_t *v, size_t n) {
  fputc('[', f);
  for (size_t i = 0; i < n; i++) fprintf(f, "%s%" PRIu64, i ? "," : "", v[i]);
  fputc(']', f);
}

static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'\">\n<title>nofrag replay</title>\n<style>\n"
    "body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin:24px 0 4px}\n"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}\n"
    "td:first-child{text-align:left}svg{display:block}.live{stroke:#1f77b4}.res{stroke:#d62728}\n"
    ".key span{display:inline-block;width:14px;height:3px;margin:0 4px 3px 12px;vertical-align:middle}\n"
    "</style></head>\n<body>\n<h1>nofrag replay: <span id=\"trace\"></span></h1>\n"
    "<table id=\"summary\"></table>\n<div id=\"charts\"></div>\n<div id=\"hot\"></div>\n<script>\n";

// Drawing: one SVG per series; x = allocator calls done, y = bytes.
static const char page_script[] =
    "const GiB=1073741824, NS='http://www.w3.org/2000/svg';\n"
    "function el(n,a,p){const e=document.createElementNS(NS,n);for(const k in a)e.setAttribute(k,a[k]);"
    "if(p)p.appendChild(e);return e;}\n"
    "function gib(b){return (b/GiB).toFixed(3)+' GiB';}\n"
    "document.getElementById('trace').textContent=DATA.trace;\n"
    "const tb=document.getElementById('summary');\n"
    // Ratios over the trace's peak live, as the text table and --json: a
    // row that stopped early has a smaller peak live of its own.
    "const TL=Math.max(1,DATA.trace_peak_live);\n"
    "tb.insertRow().innerHTML='<th>allocator</th><th>peak live</th><th>peak reserved</th>"
    "<th>reserved / trace peak live</th><th>min capacity / trace peak live</th><th>replay s</th><th>status</th>';\n"
    "for(const r of DATA.rows){const tr=tb.insertRow();for(const v of [r.name,gib(r.peak_live),gib(r.peak_reserved),"
    "(r.peak_reserved/TL).toFixed(4),r.min_capacity?(r.min_capacity/TL).toFixed(4):'',"
    "r.seconds.toFixed(3),r.status])tr.insertCell().textContent=v;}\n"
    "const cap=document.createElement('p');cap.id='ratio-note';cap.textContent='Ratios are over the trace\\'s peak live, '"
    "+gib(DATA.trace_peak_live)+' ('+DATA.trace_peak_live+' B).';tb.after(cap);\n"
    "let drawn=0;const W=960,H=300,L=70,R=20,T=16,B=36;\n"
    // One y-scale for every chart: the allocators' difference is seen, not
    // read off differing axis labels.
    "let YMAX=1;for(const s of DATA.series){YMAX=Math.max(YMAX,s.peak_reserved);"
    "for(const v of s.reserved)YMAX=Math.max(YMAX,v);for(const v of s.live)YMAX=Math.max(YMAX,v);}YMAX*=1.05;\n"
    // And one x-scale: a run that stopped early (an OOM under --limit) ends
    // where it stopped instead of stretching over the whole width.
    "let XMAX=1;for(const s of DATA.series)if(s.x.length)XMAX=Math.max(XMAX,s.x[s.x.length-1]);\n"
    "for(const s of DATA.series){\n"
    " const box=document.getElementById('charts');const h=document.createElement('h2');h.textContent=s.name;box.appendChild(h);\n"
    " const key=document.createElement('div');key.className='key';"
    "key.innerHTML='<span style=\"background:#1f77b4\"></span>live<span style=\"background:#d62728\"></span>';"
    "key.appendChild(document.createTextNode(s.reserved_label));box.appendChild(key);\n"
    " const svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,'class':'chart','data-ymax':YMAX},box);\n"
    " const n=s.x.length;if(!n)continue;const xmax=XMAX,last=s.x[n-1];\n"
    " const ymax=YMAX;\n"
    " const X=v=>L+(W-L-R)*v/xmax,Y=v=>H-B-(H-T-B)*v/ymax;\n"
    " el('line',{x1:L,y1:H-B,x2:W-R,y2:H-B,stroke:'#888'},svg);el('line',{x1:L,y1:T,x2:L,y2:H-B,stroke:'#888'},svg);\n"
    " for(let i=0;i<=4;i++){const v=ymax*i/4;const t=el('text',{x:L-6,y:Y(v)+4,'text-anchor':'end','font-size':11},svg);"
    "t.textContent=(v/GiB).toFixed(1)+' GiB';}\n"
    " const xl=el('text',{x:(L+W-R)/2,y:H-8,'text-anchor':'middle','font-size':11},svg);"
    "xl.textContent=last<xmax?'allocator calls replayed: stopped at '+last+' of '+xmax:'allocator calls replayed (of '+xmax+')';\n"
    " for(const [k,c] of [['live','live'],['reserved','res']]){const pts=[];"
    "for(let i=0;i<n;i++)pts.push(X(s.x[i]).toFixed(1)+','+Y(s[k][i]).toFixed(1));"
    "el('polyline',{points:pts.join(' '),fill:'none','class':c,'stroke-width':1.2,'data-points':n},svg);}\n"
    " const px=X(s.peak_x),py=Y(s.peak_reserved);\n"
    " el('line',{x1:px,y1:T,x2:px,y2:H-B,stroke:'#d62728','stroke-dasharray':'4 3','class':'peak'},svg);\n"
    " el('circle',{cx:px,cy:py,r:4,fill:'#d62728','class':'peak-dot'},svg);\n"
    // Right of the peak line, or left of it (anchored at its end) in the
    // chart's right half, so that the label is never cut at the edge.
    " const right=px<(L+W-R)/2;\n"
    " const pl=el('text',{x:right?px+6:px-6,y:T+10,'text-anchor':right?'start':'end','font-size':12,fill:'#d62728',"
    "'class':'peak-label'},svg);\n"
    " pl.textContent='peak reserved '+gib(s.peak_reserved)+' at call '+s.peak_x;\n"
    " drawn++;\n}\n"
    // Hotspot tables: one per model, when the trace had stacks.
    "for(const hs of DATA.hot){const box=document.getElementById('hot');const h=document.createElement('h2');"
    "h.textContent='Hotspots, '+hs.model+': reserved-but-unused memory at peak reserved ('+gib(hs.unused)+' of '"
    "+gib(hs.reserved)+', after call '+hs.peak_op+')';box.appendChild(h);\n"
    " const t=document.createElement('table');t.className='hotspots';box.appendChild(t);"
    "t.insertRow().innerHTML='<th>call site</th><th>function</th><th>unused</th><th>share</th>';\n"
    " for(const r of hs.top){const tr=t.insertRow();for(const v of [r.site,r.func,gib(r.bytes),"
    "(100*r.bytes/Math.max(1,hs.unused)).toFixed(1)+' %'])tr.insertCell().textContent=v;}}\n"
    "document.body.setAttribute('data-drawn',String(drawn));\n";

int nfc_html_write(const char *path, const char *trace, uint64_t trace_peak_live, const nfc_html_series *series,
                   size_t n_series,
                  const nfc_html_row *rows, size_t n_rows, const nfc_hotspots *hot, size_t n_hot,
                  const nfc_sites *sites) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(page_head, f);
  fputs("const DATA={\"trace\":", f);
  nfc_json_str(f, trace);
  fprintf(f, ",\"trace_peak_live\":%" PRIu64 ",\"rows\":[", trace_peak_live);
  for (size_t i = 0; i < n_rows; i++) {
    const nfc_html_row *r = &rows[i];
    fprintf(f, "%s{\"name\":", i ? "," : "");
    nfc_json_str(f, r->name);
    fprintf(f, ",\"peak_live\":%" PRIu64 ",\"peak_reserved\":%" PRIu64 ",\"min_capacity\":%" PRIu64
            ",\"seconds\":%.6f,\"status\":", r->peak_live, r->peak_reserved, r->min_capacity, r->seconds);
    nfc_json_str(f, r->status);
    fputc('}', f);
  }
  fputs("],\"series\":[", f);
  for (size_t i = 0; i < n_series; i++) {
    const nfc_html_series *s = &series[i];
    fprintf(f, "%s{\"name\":", i ? "," : "");
    nfc_json_str(f, s->name);
    fputs(",\"reserved_label\":", f);
    nfc_json_str(f, s->reserved_label);
    fprintf(f, ",\"peak_reserved\":%" PRIu64 ",\"peak_x\":%" PRIu64 ",\"x\":", s->peak_reserved, s->peak_x);
    json_arr(f, s->x, s->n);
    fputs(",\"live\":", f);
    json_arr(f, s->live, s->n);
    fputs(",\"reserved\":", f);
    json_arr(f, s->reserved, s->n);
    fputc('}', f);
  }
  fputs("],\"hot\":[", f);
  for (size_t i = 0; i < n_hot; i++) {
    const nfc_hotspots *h = &hot[i];
    fprintf(f, "%s{\"model\":\"%s\",\"reserved\":%" PRIu64 ",\"unused\":%" PRIu64 ",\"peak_op\":%zu,\"top\":[",
            i ? "," : "", nf__model_name(h->kind), h->reserved, h->unused, h->peak_op);
    nfc_hotspots_top_json(f, h, sites);
    fputs("]}", f);
  }
  fputs("]};\n", f);
  fputs(page_script, f);
  fputs("</script>\n</body></html>\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) { if (!errno) errno = EIO; return -1; }
  return 0;
}
