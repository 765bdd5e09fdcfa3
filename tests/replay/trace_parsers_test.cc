#include "replay/allocation_trace.h"
#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "allocator/simulated/simulated_backend.h"
#include "replay/trace_replay.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

constexpr char kRmmLog[] =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "140573312345856,1634567890.123456,allocate,0x7f8a40000000,1024,0x0\n"
    "140573312345856,1634567890.234567,allocate,0x7f8a40000400,2048,0x7f8a38001020\r\n"
    "\n"
    "140573312345856,1634567890.345678,free,0x7f8a40000000,1024,0x0\n"
    "140573312345856,08:03:12:345678,allocate failure,0x0,99999999999,0x0\n"
    "1,12:00:00.5,deallocate,0x7f8a40000400,2048,0x7f8a38001020\n";

TEST(RmmLogParser, ParsesAllActionsAndTimeFormats) {
  auto trace = ParseRmmLog(kRmmLog, "log.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 5u);
  EXPECT_EQ(trace->format, "rmm-csv");
  const TraceEvent& a = trace->events[1];
  EXPECT_EQ(a.op, TraceOp::kAllocate);
  EXPECT_EQ(a.pointer, 0x7f8a40000400u);
  EXPECT_EQ(a.size, 2048u);
  EXPECT_EQ(a.stream, 0x7f8a38001020u);
  EXPECT_EQ(a.time_ns, 1634567890234567000u);
  EXPECT_EQ(a.line, 3u);
  EXPECT_EQ(trace->events[2].op, TraceOp::kFree);
  EXPECT_EQ(trace->events[2].line, 5u);
  EXPECT_EQ(trace->events[3].op, TraceOp::kAllocateFailure);
  EXPECT_EQ(trace->events[3].time_ns, ((8 * 60 + 3) * 60 + 12) * 1'000'000'000ull + 345678000u);
  EXPECT_EQ(trace->events[4].op, TraceOp::kFree);
  EXPECT_EQ(trace->events[4].time_ns, 12 * 3600 * 1'000'000'000ull + 500'000'000u);
}

TEST(RmmLogParser, ColumnsMayBeReorderedAndStreamOmitted) {
  auto trace = ParseRmmLog("Action,Size,Pointer,Time\nallocate,512,16,0.5\n", "x.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 1u);
  EXPECT_EQ(trace->events[0].pointer, 16u);
  EXPECT_EQ(trace->events[0].stream, 0u);
}

TEST(RmmLogParser, MalformedLinesNameTheLine) {
  auto err = [](std::string_view text) { return std::string(ParseRmmLog(text, "t.csv").status().message()); };
  EXPECT_THAT(err(""), HasSubstr("empty"));
  EXPECT_THAT(err("a,b,c\n"), HasSubstr("t.csv:1: expected the RMM header"));
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  EXPECT_THAT(err(header + "1,0.1,allocate,0x10,64,0\n1,0.2,alloc,0x10,64,0\n"),
              HasSubstr("t.csv:3: unknown action 'alloc'"));
  EXPECT_THAT(err(header + "1,0.1,allocate,0xZZ,64,0\n"), HasSubstr("t.csv:2: bad pointer '0xZZ'"));
  EXPECT_THAT(err(header + "1,0.1,allocate,0x10,-4,0\n"), HasSubstr("bad size '-4'"));
  EXPECT_THAT(err(header + "1,yesterday,allocate,0x10,4,0\n"), HasSubstr("bad time 'yesterday'"));
  EXPECT_THAT(err(header + "1,0.1,allocate\n"), HasSubstr("t.csv:2: expected at least"));
}

constexpr char kSnapshot[] = R"({
  "segments": [],
  "device_traces": [[
    {"action": "segment_alloc", "addr": 1000, "size": 2097152, "stream": 0},
    {"action": "alloc", "addr": 1000, "size": 512, "stream": 0, "time_us": 5},
    {"action": "alloc", "addr": 1512, "size": 1024, "stream": 7},
    {"action": "free_requested", "addr": 1000, "size": 512, "stream": 0},
    {"action": "free_completed", "addr": 1000, "size": 512, "stream": 0},
    {"action": "free_completed", "addr": 1512, "size": 1024, "stream": 7},
    {"action": "oom", "size": 99, "stream": 0, "device_free": 5}
  ]]
})";

TEST(PyTorchSnapshotParser, TakesClientEventsOnly) {
  auto trace = ParsePyTorchSnapshot(kSnapshot, "snap.json");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 5u);
  EXPECT_EQ(trace->events[0].op, TraceOp::kAllocate);
  EXPECT_EQ(trace->events[0].time_ns, 5000u);
  EXPECT_EQ(trace->events[1].stream, 7u);
  EXPECT_EQ(trace->events[2].op, TraceOp::kFree);  // free_requested
  EXPECT_EQ(trace->events[3].op, TraceOp::kFree);  // free_completed without a request
  EXPECT_EQ(trace->events[3].pointer, 1512u);
  EXPECT_EQ(trace->events[4].op, TraceOp::kAllocateFailure);
  auto detected = ParseAllocationTrace(std::string("\n  ") + kSnapshot, "snap.json");
  ASSERT_TRUE(detected.ok());
  EXPECT_EQ(detected->format, "pytorch-snapshot");
}

// A history that began after the process allocated: a freed pointer the
// history never allocated, and a block still active at the end that it never
// mentions, are both restored as allocations before the first event.
TEST(PyTorchSnapshotParser, RestoresAllocationsMadeBeforeTheHistory) {
  constexpr char kTruncated[] = R"({
    "segments": [
      {"device": 0, "address": 4096, "total_size": 2097152, "stream": 0, "segment_type": "small",
       "blocks": [{"size": 1024, "requested_size": 1000, "state": "active_allocated"},
                  {"size": 2048, "state": "inactive"},
                  {"size": 512, "state": "active_allocated"},
                  {"size": 2093568, "state": "inactive"}]},
      {"device": 1, "address": 999999, "total_size": 2097152, "stream": 0, "segment_type": "small",
       "blocks": [{"size": 2097152, "state": "active_allocated"}]}
    ],
    "device_traces": [[
      {"action": "free_requested", "addr": 77777, "size": 3000, "stream": 0},
      {"action": "alloc", "addr": 7168, "size": 512, "stream": 0},
      {"action": "alloc", "addr": 50000, "size": 700, "stream": 0},
      {"action": "free_requested", "addr": 50000, "size": 700, "stream": 0}
    ], []]
  })";
  auto trace = ParsePyTorchSnapshot(kTruncated, "t.json", 0);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 6u);
  // Before the history: the freed pointer 77777, then the segment's first
  // block (4096); the block at 7168 is allocated within the history.
  EXPECT_EQ(trace->events[0].op, TraceOp::kAllocate);
  EXPECT_EQ(trace->events[0].pointer, 77777u);
  EXPECT_EQ(trace->events[0].size, 3000u);
  EXPECT_EQ(trace->events[1].op, TraceOp::kAllocate);
  EXPECT_EQ(trace->events[1].pointer, 4096u);
  EXPECT_EQ(trace->events[1].size, 1000u);
  EXPECT_EQ(trace->events[2].pointer, 77777u);
  EXPECT_EQ(trace->events[2].op, TraceOp::kFree);

  auto r = ReplayTrace(*trace, {.capacity_bytes = kGiB});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->anomalies, 0u);
  EXPECT_EQ(r->peak_live_bytes, 3000u + 1000u);  // 77777 is freed before the later allocations
}

TEST(PyTorchSnapshotParser, ErrorsNameThePath) {
  auto err = [](std::string_view text) { return std::string(ParsePyTorchSnapshot(text, "s.json").status().message()); };
  EXPECT_THAT(err("{"), HasSubstr("s.json"));
  EXPECT_THAT(err("{}"), HasSubstr("device_traces"));
  EXPECT_THAT(err(R"({"device_traces": [[{"action": "alloc", "addr": 1}]]})"),
              HasSubstr("device_traces[0][0]"));
  EXPECT_THAT(err(R"({"device_traces": [[{"action": "teleport", "addr": 1, "size": 2}]]})"),
              HasSubstr("unknown action 'teleport'"));
  EXPECT_THAT(err(R"({"device_traces": [[{"action": "alloc", "addr": -1, "size": 2}]]})"), HasSubstr("addr"));
  EXPECT_FALSE(ParsePyTorchSnapshot(kSnapshot, "s.json", 3).ok());
}

TEST(TraceReplay, CountsPeaksAndAnomalies) {
  auto trace = ParseRmmLog(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,allocate,0x10,4194304,0\n"
      "1,0.2,allocate,0x20,4194304,0x5\n"
      "1,0.3,free,0x10,4194304,0\n"
      "1,0.4,free,0x99,64,0\n"
      "1,0.5,allocate failure,0x0,1,0\n",
      "t.csv");
  ASSERT_TRUE(trace.ok());
  auto r = ReplayTrace(*trace, {.capacity_bytes = kGiB});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->allocations, 2u);
  EXPECT_EQ(r->frees, 1u);
  EXPECT_EQ(r->trace_failures, 1u);
  EXPECT_EQ(r->peak_live_bytes, 8 * kMiB);
  EXPECT_EQ(r->peak_allocated_bytes, 8 * kMiB);
  EXPECT_EQ(r->peak_reserved_bytes, 40 * kMiB);  // two streams, one 20 MiB segment each
  EXPECT_DOUBLE_EQ(r->reserved_to_allocated, 5.0);
  EXPECT_EQ(r->anomalies, 1u);
  ASSERT_EQ(r->anomaly_examples.size(), 1u);
  EXPECT_THAT(r->anomaly_examples[0], HasSubstr("t.csv:5: free of 0x99"));
  auto strict = ReplayTrace(*trace, {.capacity_bytes = kGiB, .strict = true});
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(strict.status().message()), HasSubstr("t.csv:5"));
}

TEST(TraceReplay, OomsAreCountedAndLaterFreesIgnored) {
  auto trace = ParseRmmLog(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,allocate,0x10,62914560,0\n"
      "1,0.2,allocate,0x20,62914560,0\n"
      "1,0.3,free,0x20,62914560,0\n",
      "t.csv");
  ASSERT_TRUE(trace.ok());
  auto r = ReplayTrace(*trace, {.capacity_bytes = 100 * kMiB});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ooms, 1);
  EXPECT_EQ(r->anomalies, 0u);
}

TEST(TraceReplay, OwnSnapshotReplaysToTheSamePeaks) {
  auto device = *SimulatedBackend::Create({});
  auto allocator = *CachingAllocator::Create(device.get(), {.history_entries = 10000});
  std::vector<DeviceAddress> live;
  for (int i = 0; i < 50; ++i) {
    live.push_back(*allocator->Allocate(static_cast<uint64_t>(i % 7 + 1) * 3 * kMiB + 100));
    if (i % 3 == 2) {
      ASSERT_TRUE(allocator->Free(live[live.size() - 2]).ok());
      live.erase(live.end() - 2);
    }
  }
  const std::string json = SnapshotToJson(allocator->TakeSnapshot()).dump();
  auto trace = ParsePyTorchSnapshot(json, "own.json");
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto r = ReplayTrace(*trace, {});
  ASSERT_TRUE(r.ok()) << r.status();
  const MemoryStats s = allocator->GetStats();
  EXPECT_EQ(r->peak_allocated_bytes, static_cast<uint64_t>(s.allocated_bytes[kAllPools].peak));
  EXPECT_EQ(r->peak_reserved_bytes, static_cast<uint64_t>(s.reserved_bytes[kAllPools].peak));
  EXPECT_EQ(r->anomalies, 0u);
}

// A stitched block's pieces stay in their segments with no event of their
// own: a replay of a history that begins after they were freed counts the
// stitched block, and not its pieces again as blocks allocated before it.
TEST(TraceReplay, OwnSnapshotCountsAStitchedBlockOnce) {
  auto device = *SimulatedBackend::Create({.capacity_bytes = 6 * kMiB, .map_granularity = 2 * kMiB});
  auto allocator = *CachingAllocator::Create(device.get(), {.expandable_segments = true,
                                                            .expandable_large_page_bytes = 2 * kMiB,
                                                            .unified_pool = true,
                                                            .stitch_pages = true,
                                                            .history_entries = 2});
  std::vector<DeviceAddress> blocks;
  for (uint64_t size : {kMiB, kMiB, kMiB, kMiB, 2 * kMiB}) blocks.push_back(*allocator->Allocate(size));
  ASSERT_TRUE(allocator->Free(blocks[0]).ok());
  ASSERT_TRUE(allocator->Free(blocks[3]).ok());
  // A head of page 0 and a tail of page 1; the history keeps its segment_map and alloc only.
  const DeviceAddress stitched = *allocator->Allocate(2 * kMiB);
  ASSERT_EQ(allocator->GetStats().num_stitched_blocks, 1);
  auto trace = ParsePyTorchSnapshot(SnapshotToJson(allocator->TakeSnapshot()).dump(), "own.json");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 4u);  // the three live blocks before the history, then the stitched one
  EXPECT_EQ(trace->events.back().pointer, stitched);
  auto r = ReplayTrace(*trace, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peak_live_bytes, 6 * kMiB);
}

TEST(TraceReplay, ExpandableSegmentsReduceOverhead) {
  // A transformer-like step: growing activations, then freed in reverse.
  AllocationTrace trace{.source = "synthetic", .format = "rmm-csv", .events = {}};
  uint64_t pointer = 1;
  for (int step = 0; step < 3; ++step) {
    std::vector<uint64_t> acts;
    for (int layer = 0; layer < 24; ++layer) {
      for (uint64_t size : {uint64_t{37} * kMiB + 4096, uint64_t{12} * kMiB + 512, uint64_t{3} * kMiB}) {
        trace.events.push_back({.op = TraceOp::kAllocate, .pointer = pointer, .size = size + static_cast<uint64_t>(step) * kMiB});
        acts.push_back(pointer++);
      }
    }
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) trace.events.push_back({.op = TraceOp::kFree, .pointer = *it});
  }
  auto plain = ReplayTrace(trace, {});
  auto expandable = ReplayTrace(trace, {.allocator = *ParseAllocConf("expandable_segments:True")});
  ASSERT_TRUE(plain.ok() && expandable.ok());
  EXPECT_LE(expandable->reserved_to_live, 1.05);
  EXPECT_LT(expandable->peak_reserved_bytes, plain->peak_reserved_bytes);
}

// Note [Zero-byte allocations]: a 0-byte request gets a null pointer (or,
// from some allocators, a unique one) and takes no memory; its free matches
// it and is not "a free of a pointer the trace never allocated".
TEST(TraceReplay, ZeroByteAllocationsAndTheirFreesMatch) {
  auto trace = ParseRmmLog(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,allocate,0x0,0,0\n"
      "1,0.2,allocate,0x0,0,0\n"
      "1,0.3,allocate,0x40,0,0\n"
      "1,0.4,allocate,0x10,4096,0\n"
      "1,0.5,free,0x0,0,0\n"
      "1,0.6,free,0x40,0,0\n"
      "1,0.7,free,0x0,0,0\n"
      "1,0.8,free,0x10,4096,0\n",
      "zero.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto r = ReplayTrace(*trace, {.capacity_bytes = kGiB, .strict = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->anomalies, 0u);
  EXPECT_EQ(r->allocations, 2u);  // 0x40 (0 bytes, a unique pointer) and 0x10
  EXPECT_EQ(r->frees, 2u);
  EXPECT_EQ(r->peak_live_bytes, 4096u);
  EXPECT_EQ(r->final_stats.allocated_bytes[kAllPools].current, 0);
}

TEST(TraceReplay, SizeBeyondAnyDeviceNamesTheLine) {
  auto trace = ParseRmmLog(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,allocate,0x10,4096,0\n"
      "1,0.2,allocate,0x20,18446744073709551615,0\n",
      "huge.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto r = ReplayTrace(*trace, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("huge.csv:3: allocation of 18446744073709551615 bytes: allocate: "));
}

TEST(TraceReplay, CapacityBeyondTheSimulatedDeviceIsRefused) {
  AllocationTrace trace{.source = "t.csv", .format = "rmm-csv", .events = {}};
  auto r = ReplayTrace(trace, {.capacity_bytes = kMaxSimulatedCapacity + 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("capacity_bytes"));
  EXPECT_TRUE(ReplayTrace(trace, {.capacity_bytes = kMaxSimulatedCapacity}).ok());
}

// 3 MiB and 5 MiB live at once, then freed, at times 1-4; a step ends at time 2.
AllocationTrace TwoBlocks() {
  return {.source = "two.csv",
          .format = "rmm-csv",
          .events = {{.op = TraceOp::kAllocate, .pointer = 0x10, .size = 3 * kMiB, .time_ns = 1},
                     {.op = TraceOp::kAllocate, .pointer = 0x20, .size = 5 * kMiB, .time_ns = 2},
                     {.op = TraceOp::kFree, .pointer = 0x10, .size = 3 * kMiB, .time_ns = 3},
                     {.op = TraceOp::kFree, .pointer = 0x20, .size = 5 * kMiB, .time_ns = 4}}};
}

// Four 1 MiB blocks fill two 2 MiB pages; with one freed in each page, 2 MiB
// are free but no 2 MiB block is: the next 2 MiB request fails on a 4 MiB
// device although the live bytes would fit. Then a request the live bytes
// alone leave no room for. The replay reports the first failure of each.
TEST(TraceReplay, FirstOutOfMemoryTellsFragmentationFromLiveBytes) {
  auto event = [](TraceOp op, uint64_t pointer, uint64_t size, size_t line) {
    return TraceEvent{.op = op, .pointer = pointer, .size = size, .time_ns = line, .line = line};
  };
  AllocationTrace trace{.source = "pieces.csv", .format = "rmm-csv"};
  for (uint64_t p = 1; p <= 4; ++p) trace.events.push_back(event(TraceOp::kAllocate, p, kMiB, p + 1));
  trace.events.push_back(event(TraceOp::kFree, 1, kMiB, 6));
  trace.events.push_back(event(TraceOp::kFree, 3, kMiB, 7));
  trace.events.push_back(event(TraceOp::kAllocate, 5, 2 * kMiB, 8));
  trace.events.push_back(event(TraceOp::kAllocate, 6, 3 * kMiB, 9));
  const ReplayOptions options{.capacity_bytes = 4 * kMiB,
                              .allocator = *ParseAllocConf("expandable_segments:True,expandable_page_mb:2")};
  auto r = ReplayTrace(trace, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ooms, 2);
  ASSERT_TRUE(r->first_oom.has_value());
  EXPECT_EQ(r->first_oom->location, "pieces.csv:8");
  EXPECT_EQ(r->first_oom->capacity_bytes, 4 * kMiB);
  EXPECT_EQ(r->first_oom->requested_bytes, 2 * kMiB);
  EXPECT_EQ(r->first_oom->live_bytes, 2 * kMiB);
  EXPECT_EQ(r->first_oom->reserved_bytes, 4 * kMiB);
  EXPECT_EQ(r->first_oom->free_cached_bytes, 2 * kMiB);
  EXPECT_EQ(r->first_oom->largest_free_block_bytes, kMiB);

  auto stopped = ReplayTrace(trace, {.capacity_bytes = 4 * kMiB,
                                     .allocator = options.allocator,
                                     .stop_at_first_oom = true});
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->ooms, 1);
  trace.events.erase(trace.events.end() - 2);  // now the 3 MiB request fails first: 2 MiB live
  r = ReplayTrace(trace, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->first_oom.has_value());
  EXPECT_EQ(r->first_oom->location, "pieces.csv:9");
  EXPECT_EQ(r->first_oom->live_bytes, 2 * kMiB);
  EXPECT_EQ(r->first_oom->requested_bytes, 3 * kMiB);
  EXPECT_FALSE(ReplayTrace(TwoBlocks(), {})->first_oom.has_value());
}

TEST(TraceReplay, StatisticsAreKeptAtEachStepsEnd) {
  auto r = ReplayTrace(TwoBlocks(), {.step_end_times = {2, 3, 100}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->step_stats.size(), 3u);
  EXPECT_EQ(r->step_stats[0].allocated_bytes[kAllPools].current, static_cast<int64_t>(8 * kMiB));  // events 1-2
  EXPECT_EQ(r->step_stats[1].allocated_bytes[kAllPools].current, static_cast<int64_t>(5 * kMiB));  // and 3
  EXPECT_EQ(r->step_stats[2].allocated_bytes[kAllPools].current, 0);  // a step the trace did not reach: the end
  auto unsorted = ReplayTrace(TwoBlocks(), {.step_end_times = {3, 2}});
  ASSERT_FALSE(unsorted.ok());
  EXPECT_THAT(std::string(unsorted.status().message()), HasSubstr("two.csv: step end times are not in ascending"));
}

// PyTorch's policy serves 3 MiB from a 20 MiB segment and the 5 MiB from its
// rest, so it needs 20 MiB; expandable segments of 2 MiB pages need the 8 MiB
// live. A device too small to run the trace at all is NotFound.
TEST(TraceReplay, SmallestDeviceBisectsTheCapacity) {
  auto pytorch = SmallestDevice(TwoBlocks(), {});
  ASSERT_TRUE(pytorch.ok()) << pytorch.status();
  EXPECT_EQ(*pytorch, 20 * kMiB);
  auto expandable =
      SmallestDevice(TwoBlocks(), {.allocator = *ParseAllocConf("expandable_segments:True,expandable_page_mb:2")});
  ASSERT_TRUE(expandable.ok()) << expandable.status();
  EXPECT_EQ(*expandable, 8 * kMiB);
  auto too_small = SmallestDevice(TwoBlocks(), {.capacity_bytes = 6 * kMiB});
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(too_small.status().message()), HasSubstr("two.csv does not run on a device of 6.00 MiB"));
}

}  // namespace
}  // namespace headroom
