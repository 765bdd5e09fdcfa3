/* Headroom's caching allocator as a C library, loadable by PyTorch's
 * CUDAPluggableAllocator:
 *
 *   import torch
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *       "libheadroom_cuda_alloc.so", "headroom_malloc", "headroom_free")
 *   torch.cuda.memory.change_current_allocator(alloc)
 *
 * One caching allocator per device, created on first use with the options
 * in the environment variable HEADROOM_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF
 * syntax or a preset's name; see allocator/alloc_conf.h). Unset, it is
 * Headroom's own policy (the `headroom` preset), or PyTorch's on a device
 * without the virtual memory API; `pytorch-default` (or an empty string)
 * is PyTorch's policy bit for bit. An invalid HEADROOM_ALLOC_CONF makes
 * every allocation on that device fail, with the reason on stderr and in
 * headroom_last_error().
 *
 * Functions returning int return 0 on success and -1 on error; the error's
 * text is then in headroom_last_error() (per thread, valid until the next
 * call on that thread).
 */
#ifndef HEADROOM_ALLOCATOR_CUDA_C_ABI_HEADROOM_ALLOC_H_
#define HEADROOM_ALLOCATOR_CUDA_C_ABI_HEADROOM_ALLOC_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#if defined(__GNUC__)
#define HEADROOM_C_API __attribute__((visibility("default")))
#else
#define HEADROOM_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The two entry points PyTorch's CUDAPluggableAllocator loads. `size` 0
 * returns NULL (as PyTorch's own allocator does) and is no error; a negative
 * size returns NULL with the reason in headroom_last_error(). On
 * out-of-memory, headroom_malloc returns NULL and writes the
 * allocator's explanation to stderr. A free on a stream other than the
 * allocation's stream is treated as a use of the block by that stream
 * (headroom_record_stream) followed by a free. */
HEADROOM_C_API void* headroom_malloc(ssize_t size, int device, cudaStream_t stream);
HEADROOM_C_API void headroom_free(void* ptr, ssize_t size, int device, cudaStream_t stream);

/* Statistics; the caller sets `version` and `struct_size` so that the
 * library fills only the fields both sides know. Meanings as in
 * torch.cuda.memory_stats() ("...all.current" / "...all.peak").
 * Fields are 8 bytes wide, only ever appended, so a struct of any version
 * holds a prefix of them: the library fills the whole fields inside
 * `struct_size` bytes, up to the last field it knows, and leaves the rest
 * (fields of a newer header) and `version` and `struct_size` untouched.
 * Errors: NULL, version 0, or a struct_size with no field in it. */
#define HEADROOM_STATS_VERSION 4
typedef struct headroom_stats {
  uint32_t version;     /* HEADROOM_STATS_VERSION */
  uint32_t struct_size; /* sizeof(headroom_stats) */
  int64_t allocated_bytes;
  int64_t allocated_bytes_peak;
  int64_t reserved_bytes;
  int64_t reserved_bytes_peak;
  int64_t active_bytes;
  int64_t requested_bytes;
  int64_t inactive_split_bytes;
  int64_t allocations;
  int64_t segments;
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t num_device_alloc;
  int64_t num_device_free;
  uint64_t largest_free_block_bytes;
  double external_fragmentation;
  /* Version 2: expandable segments' pages (of the pool's page size) mapped
   * and unmapped so far, new or moved between pools and streams (0 without
   * expandable segments).
   * Read after warm-up and again later, they show whether a training loop
   * still maps pages in its steady steps. */
  int64_t num_pages_mapped;
  int64_t num_pages_unmapped;
  /* Version 3: blocks served, where the device was out of memory, from free
   * pieces of pages mapped again side by side (stitch_pages). */
  int64_t num_stitched_blocks;
  /* Version 4: allocations served where a layout plan put them
   * (HEADROOM_ALLOC_CONF's layout_plan); it stops growing once the job left
   * its plan. */
  int64_t num_planned_allocs;
} headroom_stats;
HEADROOM_C_API int headroom_get_stats(int device, headroom_stats* stats);

/* The snapshot as JSON in torch.cuda.memory._snapshot()'s structure. Writes
 * at most `capacity` bytes including the terminating NUL and returns the
 * full length without it (call with capacity 0 to size the buffer), or -1. */
HEADROOM_C_API ssize_t headroom_snapshot_json(int device, char* buffer, size_t capacity);

/* A torch.cuda.memory_summary()-style table of the statistics; same buffer
 * convention as headroom_snapshot_json. */
HEADROOM_C_API ssize_t headroom_memory_summary(int device, char* buffer, size_t capacity);

/* Why the job left the layout plan HEADROOM_ALLOC_CONF's layout_plan names
 * ("request 812 asks for ... bytes; the plan has ... there"), empty while it
 * follows one or has none; same buffer convention as headroom_snapshot_json. */
HEADROOM_C_API ssize_t headroom_plan_departure(int device, char* buffer, size_t capacity);

HEADROOM_C_API int headroom_empty_cache(int device);
HEADROOM_C_API int headroom_record_stream(void* ptr, int device, cudaStream_t stream);
HEADROOM_C_API int headroom_set_memory_fraction(double fraction, int device);
HEADROOM_C_API int headroom_reset_peak_stats(int device);
/* Starts (max_entries > 0) or stops recording the history in snapshots.
 * At most 2^32 entries (HEADROOM_ALLOC_CONF's history_entries limit); more
 * is an error and changes nothing. */
HEADROOM_C_API int headroom_record_history(int device, size_t max_entries);
/* Allocates a cuBLAS workspace from the allocator and installs it with
 * cublasSetWorkspace; free it with headroom_free(*workspace, bytes, ...)
 * after the handle stops using it. `cublas_handle` is a cublasHandle_t. */
HEADROOM_C_API int headroom_cublas_set_workspace(void* cublas_handle, size_t bytes, int device, cudaStream_t stream,
                                  void** workspace);

HEADROOM_C_API const char* headroom_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* HEADROOM_ALLOCATOR_CUDA_C_ABI_HEADROOM_ALLOC_H_ */
