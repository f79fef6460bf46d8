// Allocation traces: reader and replay preprocessing (internal).
//
// A trace is text, optionally gzip-compressed (format: docs/replay.md):
//
//     # comment
//     ACTION ADDR SIZE STREAM TIME_US
//
// ACTION is one of alloc, free_requested, free_completed, segment_alloc,
// segment_free; the other fields are unsigned decimal integers. Parsing is
// strict: any malformed line fails the whole load with NF_ERR_INVALID and a
// message "FILE:LINE: what is wrong". Blank lines are allowed.
//
// Loading keeps every event in memory (40 bytes each); nf__trace_ops_build
// then turns the events into the allocator calls a replay makes: addresses
// become dense slot ids (reused after free_completed), stream handles dense
// stream ids, and the demand statistics (peak live, native segment peak) are
// computed once.
#ifndef NF_TRACE_H
#define NF_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "nofrag.h"

// Longest line accepted (comments included). Real lines are under 100 bytes.
#define NF_TRACE_MAX_LINE 4096

typedef enum nf_trace_action_e {
  NF_TRACE_ALLOC = 0,
  NF_TRACE_FREE_REQUESTED = 1,
  NF_TRACE_FREE_COMPLETED = 2,
  NF_TRACE_SEGMENT_ALLOC = 3,
  NF_TRACE_SEGMENT_FREE = 4,
  NF_TRACE_NACTIONS = 5,
} nf_trace_action_t;

typedef struct nf_trace_event_s {
  uint8_t action;   // nf_trace_action_t
  uint32_t line;    // 1-based line in the file (for messages), saturates
  uint64_t addr;
  uint64_t size;
  uint64_t stream;
  uint64_t time_us;
} nf_trace_event_t;

typedef struct nf_trace_s {
  char *name;                // file name as given (for messages)
  nf_trace_event_t *events;
  size_t n_events;
  size_t cap;
  size_t counts[NF_TRACE_NACTIONS]; // events per action
} nf_trace_t;

// Load the trace at `path` (gzip or plain text). On failure `t` is left empty
// (nothing to free) and `err` holds "FILE:LINE: message" or "FILE: message".
nf_status_t nf__trace_load(nf_trace_t *t, const char *path, char *err, size_t errlen);

// Parse a trace held in memory (uncompressed text); `name` is used in
// messages. Same contract as nf__trace_load. Used by the fuzzer.
nf_status_t nf__trace_parse_buffer(nf_trace_t *t, const char *name, const char *buf, size_t len,
                                   char *err, size_t errlen);

// Free a loaded trace (safe on a zeroed or already freed trace).
void nf__trace_free(nf_trace_t *t);

// ---------------------------------------------------------------- replay ops

typedef enum nf_trace_op_kind_e { NF_TRACE_OP_ALLOC = 0, NF_TRACE_OP_FREE = 1 } nf_trace_op_kind_t;

typedef struct nf__trace_op_s {
  uint32_t kind;   // nf_trace_op_kind_t
  uint32_t slot;   // dense id of the block, reused once it is freed
  uint32_t stream; // dense stream id (alloc only)
  uint32_t event;  // index of the trace event this op comes from
  uint64_t size;   // requested bytes (free: the size allocated)
  uint64_t time_us; // the event's time (the pool's clock in replay: release_idle_ms)
} nf__trace_op;

typedef struct nf__trace_ops_s {
  nf__trace_op *ops;
  size_t n_ops;
  size_t n_slots;            // slot ids are < n_slots (= max blocks live at once)
  uint64_t *streams;         // raw stream handle of each dense stream id
  size_t n_streams;
  size_t n_events;           // trace events, all actions
  size_t n_allocs, n_frees;  // frees = free_completed
  size_t n_free_requested;   // recorded, not replayed
  size_t n_segment_alloc, n_segment_free;
  size_t live_at_end;        // blocks never freed
  uint64_t peak_live;        // max running sum of requested sizes
  uint64_t native_peak_reserved; // max running sum of segment sizes (PyTorch's answer)
} nf__trace_ops;

// Build the replay ops of a loaded trace. Errors (alloc of a live address,
// free of an unknown address, free size differing from the alloc's, unknown
// segment, more than 2^32 events) return NF_ERR_INVALID with "FILE:LINE: ..."
// and leave `ops` empty.
nf_status_t nf__trace_ops_build(nf__trace_ops *ops, const nf_trace_t *t, char *err, size_t errlen);
void nf__trace_ops_free(nf__trace_ops *ops);
// Per event of `t`: its SIZE, except that a segment_free gets the size its
// segment_alloc recorded (as nf__trace_ops_build counts it). malloc'ed
// (free() it), NULL when out of memory.
uint64_t *nf__trace_segment_sizes(const nf_trace_t *t);


// ---------------------------------------------------------------- RMM CSV logs
// (src/trace_rmm.c) rmm::mr::logging_resource_adaptor's log: a header line
// "Thread,Time,Action,Pointer,Size,Stream", then one row per call. allocate
// becomes alloc, free becomes free_completed, "allocate failure" is skipped;
// Pointer is hex ("(nil)" = 0), Stream hex with 0x or decimal, Time
// "HH:MM:SS:uuuuuu" or epoch "S.ffffff" (else 0). Same strict contract as
// nf__trace_load: errors are "FILE:LINE: ...", nothing kept on failure.
#include <stdio.h>

// Nonzero when buf starts with the RMM header line (format detection).
int nf__trace_is_rmm(const char *buf, size_t len);
nf_status_t nf__trace_parse_rmm_buffer(nf_trace_t *t, const char *name, const char *buf, size_t len,
                                       char *err, size_t errlen);
// `path` may be gzip-compressed.
nf_status_t nf__trace_load_rmm(nf_trace_t *t, const char *path, char *err, size_t errlen);
// Write alloc and free_completed events as an RMM log (one Thread, so that
// RMM's replay benchmark keeps our order); *written = rows, if not NULL.
nf_status_t nf__trace_write_rmm(const nf_trace_t *t, FILE *out, size_t *written);

// Shared by the readers (trace.c, trace_rmm.c): a message into `err`, and a
// printable copy of at most 40 bytes of a token ("..." when cut) for it.
void nf__trace_set_err(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void nf__trace_quote(char *out, size_t outlen, const char *s, size_t n);

// The line reader both formats share, so that a file is split into lines
// exactly as a buffer is. `fn` gets each line without its '\n' (a '\r'
// before it is the parser's business), numbered from 1, the last line too
// when the input does not end in '\n'; its first error stops the read.
typedef nf_status_t (*nf__trace_line_fn)(void *ctx, size_t line, const char *s, size_t n);
// Every line of buf[0..len) (buf may be NULL when len is 0).
nf_status_t nf__trace_split_lines(const char *buf, size_t len, nf__trace_line_fn fn, void *ctx);
// Every line of the file at `path`, gzip-compressed or not, streamed: the
// memory used is about 1 MiB whatever the file's size. A line of more than
// `max_line` bytes is not read to its end: `fn` gets its first max_line + 1
// bytes or more (n > max_line) and must refuse it ("line too long", or a
// header check failing); if it does not, that is the error. Errors of the
// reader itself: "FILE: cannot open: ...", "FILE:LINE: read error: ..."
// (a corrupt or truncated gzip stream), "FILE: out of memory".
nf_status_t nf__trace_read_lines(const char *path, size_t max_line, nf__trace_line_fn fn, void *ctx,
                                 char *err, size_t errlen);

#endif
