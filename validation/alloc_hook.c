// An LD_PRELOAD hook that records PyTorch's CPU tensor allocations.
//
// PyTorch's CPU allocator (c10/core/impl/alloc_cpu.cpp) takes every tensor's
// storage from posix_memalign with 64-byte alignment and returns it with
// free(). This library interposes both: while recording is on, each
// posix_memalign(64) block is entered in a table and each free() of a
// tabled block leaves it, so the live bytes, their peak and the op running
// at the peak are exact, and every event can be written out as an RMM CSV
// line (`headroom replay` reads those). Other allocations (Python objects,
// numpy, BLAS buffers) use malloc or other alignments and are not counted.
//
// Python drives it through ctypes (validation/headroom_validation/hook.py):
//   hr_start()            begin recording (the table starts empty)
//   hr_mark(i)            the op running now is number i (attribution of the peak)
//   hr_reset_peak()       peak := live bytes now
//   hr_live(), hr_peak(), hr_peak_mark()
//   hr_dropped()          blocks not counted because the table was full (must be 0)
//   hr_events()           events so far (an event's number is its line's time in the log, in ns)
//   hr_log_open(path)     write every later event to `path` as RMM CSV, after
//                         one "allocate" line per block live now (a prologue)
//   hr_log_close()
//   hr_stop()             stop recording
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TABLE_BITS 22
#define TABLE_SIZE (1u << TABLE_BITS)
#define TOMBSTONE ((uintptr_t)1)

static int (*real_posix_memalign)(void**, size_t, size_t);
static void (*real_free)(void*);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int recording;
static uintptr_t* keys;  // open addressing: 0 empty, TOMBSTONE deleted
static size_t* sizes;
static size_t entries;
static unsigned long long live_bytes, peak_bytes, events, dropped;
static long long mark, peak_mark = -1;
static FILE* log_file;
static __thread int in_hook;

static void resolve(void) {
  if (!real_posix_memalign) real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  if (!real_free) real_free = dlsym(RTLD_NEXT, "free");
}

static size_t slot_of(uintptr_t p) { return (size_t)((p >> 6) * 0x9E3779B97F4A7C15ull >> (64 - TABLE_BITS)); }

static void log_event(const char* action, uintptr_t p, size_t n) {
  if (!log_file) return;
  // Time is the event's sequence number in nanoseconds: replay needs order, not wall time.
  fprintf(log_file, "1,%llu.%09llu,%s,0x%lx,%zu,0x0\n", events / 1000000000ull, events % 1000000000ull, action,
          (unsigned long)p, n);
}

static void insert(uintptr_t p, size_t n) {
  if (entries * 2 >= TABLE_SIZE) {  // full: counted as dropped; the harness refuses the measurement
    ++dropped;
    return;
  }
  for (size_t i = slot_of(p);; i = (i + 1) & (TABLE_SIZE - 1)) {
    if (keys[i] == 0 || keys[i] == TOMBSTONE) {
      keys[i] = p;
      sizes[i] = n;
      ++entries;
      live_bytes += n;
      ++events;
      if (live_bytes > peak_bytes) {
        peak_bytes = live_bytes;
        peak_mark = mark;
      }
      log_event("allocate", p, n);
      return;
    }
  }
}

static void erase(uintptr_t p) {
  for (size_t i = slot_of(p); keys[i] != 0; i = (i + 1) & (TABLE_SIZE - 1)) {
    if (keys[i] == p) {
      keys[i] = TOMBSTONE;
      --entries;
      live_bytes -= sizes[i];
      ++events;
      log_event("free", p, sizes[i]);
      return;
    }
  }
}

int posix_memalign(void** out, size_t alignment, size_t n) {
  resolve();
  int rc = real_posix_memalign(out, alignment, n);
  if (rc == 0 && recording && alignment == 64 && !in_hook) {
    in_hook = 1;
    pthread_mutex_lock(&lock);
    insert((uintptr_t)*out, n);
    pthread_mutex_unlock(&lock);
    in_hook = 0;
  }
  return rc;
}

void free(void* p) {
  resolve();
  if (p && recording && !in_hook) {
    in_hook = 1;
    pthread_mutex_lock(&lock);
    erase((uintptr_t)p);
    pthread_mutex_unlock(&lock);
    in_hook = 0;
  }
  real_free(p);
}

int hr_start(void) {
  resolve();
  pthread_mutex_lock(&lock);
  if (!keys) {
    keys = calloc(TABLE_SIZE, sizeof *keys);
    sizes = calloc(TABLE_SIZE, sizeof *sizes);
  }
  int ok = keys && sizes;
  if (ok) recording = 1;
  pthread_mutex_unlock(&lock);
  return ok;
}

void hr_stop(void) { recording = 0; }
void hr_mark(long long i) { mark = i; }
unsigned long long hr_live(void) { return live_bytes; }
unsigned long long hr_peak(void) { return peak_bytes; }
long long hr_peak_mark(void) { return peak_mark; }
unsigned long long hr_dropped(void) { return dropped; }
unsigned long long hr_events(void) { return events; }

void hr_reset_peak(void) {
  pthread_mutex_lock(&lock);
  peak_bytes = live_bytes;
  peak_mark = mark;
  pthread_mutex_unlock(&lock);
}

int hr_log_open(const char* path) {
  pthread_mutex_lock(&lock);
  in_hook = 1;
  log_file = fopen(path, "w");
  if (log_file) {
    fputs("Thread,Time,Action,Pointer,Size,Stream\n", log_file);
    for (size_t i = 0; i < TABLE_SIZE; ++i) {
      if (keys[i] != 0 && keys[i] != TOMBSTONE) {
        ++events;
        log_event("allocate", keys[i], sizes[i]);
      }
    }
  }
  in_hook = 0;
  pthread_mutex_unlock(&lock);
  return log_file != NULL;
}

void hr_log_close(void) {
  pthread_mutex_lock(&lock);
  in_hook = 1;
  if (log_file) fclose(log_file);
  log_file = NULL;
  in_hook = 0;
  pthread_mutex_unlock(&lock);
}
