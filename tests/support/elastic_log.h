#pragma once
// What an elastic run's log and records say (--elastic, comm/elastic/elastic.h): the generations
// that went on, and whether each epoch trained every sample once.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace ddp::testing {

// A generation that went on: its world size and the last committed step it started after.
struct GoingOn {
  int world = 0;
  int after_step = 0;
  int epoch = 0;  // 1-based: the epoch it went on in
};

// From the elastic run's log, each generation that went on, in order ("...; generation G: W
// rank(s) (...), batch B per rank, going on after step S (..."), each once (every member may log
// it).
inline std::vector<GoingOn> generations_that_went_on(const std::string& output) {
  const std::regex line(
      "generation (\\d+): (\\d+) rank\\(s\\) \\([^)]*\\), batch \\d+ per rank, "
      "going on after step (\\d+) \\(\\d+ of epoch (\\d+)\\)");
  std::vector<GoingOn> out;
  int last = 0;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    const int g = std::stoi((*it)[1]);
    if (g <= last) continue;
    last = g;
    out.push_back({std::stoi((*it)[2]), std::stoi((*it)[3]), std::stoi((*it)[4])});
  }
  return out;
}

// samples.jsonl (--record-samples) of a run of `epochs` epochs of `steps` steps on 100 samples
// that started with `first_world` ranks and whose generations went on as `changes`: one line per
// committed step, steps 1, 2, ... in order (a dropped step has none); in each epoch every sample
// trained, and no more twice than DistributedSampler's padding allows: the epoch's own (to a
// multiple of the world it starts with), and for each change within it the rest of the epoch
// padded again for the new world (fewer than `max_world` more). No sample lost, none trained twice
// for a failure.
inline void expect_each_sample_once_an_epoch(const std::string& jsonl,
                                             const std::vector<GoingOn>& changes, int epochs,
                                             int steps, int first_world, int max_world) {
  constexpr int kSamples = 100;
  std::map<int, std::vector<int>> seen;  // epoch -> how often each id was trained
  std::istringstream lines(jsonl);
  std::string line;
  int64_t step = 0;
  while (std::getline(lines, line)) {
    const auto record = nlohmann::json::parse(line);
    ASSERT_EQ(record.at("step").get<int64_t>(), ++step) << line;
    auto& counts = seen[record.at("epoch").get<int>()];
    counts.resize(kSamples);
    for (const auto& rank_ids : record.at("ids")) {
      for (const auto& id : rank_ids) ++counts.at(id.get<size_t>());
    }
  }
  EXPECT_EQ(step, epochs * steps);
  ASSERT_EQ(seen.size(), static_cast<size_t>(epochs));
  for (const auto& epoch_counts : seen) {
    const int epoch = epoch_counts.first;  // (C++17's lambdas cannot capture a binding)
    const std::vector<int>& counts = epoch_counts.second;
    int extra = 0;
    for (size_t id = 0; id < counts.size(); ++id) {
      EXPECT_GE(counts[id], 1) << "epoch " << epoch << ": sample " << id << " never trained";
      extra += std::max(0, counts[id] - 1);
    }
    // A change after the epoch's last step (or before its first) makes the next epoch start at
    // the new world; one after a step inside it pads the epoch's rest again.
    const int first_step = (epoch - 1) * steps;
    int world = first_world;
    int allowed = 0;
    for (const GoingOn& c : changes) {
      if (c.after_step <= first_step) world = c.world;
      if (c.after_step > first_step && c.after_step < first_step + steps) allowed += max_world - 1;
    }
    allowed += (world - kSamples % world) % world;
    EXPECT_LE(extra, allowed) << "epoch " << epoch << " (started with " << world << " rank(s))";
  }
}

// The launcher's lines about worker ids that `id` matches (a regex): "elastic: worker 1.0 (local
// rank 1) started: pid 4242", the pid its last group; "elastic: worker 1.0 (local rank 1, pid
// 4242) lost"; at any end, "... (local rank 1, pid 4242) finished after 40.1 s, 37.20 CPU s" or
// "... lost: signal SIGKILL (9), after 3.2 s, 2.95 CPU s", its last three groups "finished" or
// "lost: <how>,", the seconds, the CPU seconds.
inline std::string started_line(const std::string& id) {
  return "elastic: worker " + id + " \\(local rank \\d+\\) started: pid (\\d+)";
}
inline std::string ended_prefix(const std::string& id) {
  return "elastic: worker " + id + " \\(local rank \\d+, pid \\d+\\) ";
}
inline std::string lost_line(const std::string& id) { return ended_prefix(id) + "lost"; }
inline std::string end_line(const std::string& id) {
  return ended_prefix(id) + "(finished|lost: [^,]+,) after ([0-9.]+) s, ([0-9.]+) CPU s";
}
// A worker id as a regex that matches it alone.
inline std::string id_pattern(const std::string& id) {
  return std::regex_replace(id, std::regex("\\."), "\\.");
}

// The pid the launcher started elastic worker `id` in; 0 when it started none.
inline int started_pid(const std::string& output, const std::string& id) {
  const std::regex line(started_line(id_pattern(id)));
  std::smatch m;
  return std::regex_search(output, m, line) ? std::stoi(m[1]) : 0;
}

// The workers the launcher started and has not named lost, id -> pid.
inline std::map<std::string, int> live_workers(const std::string& output) {
  std::map<std::string, int> live;
  const std::regex started(started_line("(\\S+)"));
  for (auto it = std::sregex_iterator(output.begin(), output.end(), started);
       it != std::sregex_iterator(); ++it) {
    live[(*it)[1]] = std::stoi((*it)[2]);
  }
  const std::regex lost(lost_line("(\\S+)"));
  for (auto it = std::sregex_iterator(output.begin(), output.end(), lost);
       it != std::sregex_iterator(); ++it) {
    live.erase((*it)[1]);
  }
  return live;
}

// The workers of the first generation (ids "<local rank>.0" of one node, `node` + "<local
// rank>.0" of one of several: "0.") that the launcher `output` never named as lost finished in the
// very process they started in: the launcher's "every member finished: worker 0.0 (pid 4242), ..."
// names the pid each was started with, and each said that pid itself after a change ("elastic:
// worker 0.0 (pid 4242): step 6 dropped in generation 0 ..."). Returns how many there were.
inline int expect_survivors_kept_their_processes(const std::string& output, int nproc,
                                                 const std::string& node = "") {
  int survivors = 0;
  for (int local = 0; local < nproc; ++local) {
    const std::string id = node + std::to_string(local) + ".0";
    const std::regex lost(lost_line(id_pattern(id)) + ": ");
    if (std::regex_search(output, lost)) continue;
    ++survivors;
    const int pid = started_pid(output, id);
    EXPECT_GT(pid, 0) << "worker " << id << " was never started\n" << output;
    const std::string as_finished = "worker " + id + " (pid " + std::to_string(pid) + ")";
    const size_t finished = output.find("elastic: every member finished: ");
    EXPECT_NE(finished, std::string::npos) << output;
    if (finished == std::string::npos) continue;
    EXPECT_NE(output.find(as_finished, finished), std::string::npos)
        << "worker " << id << " (pid " << pid << ") did not finish in its own process\n"
        << output;
    EXPECT_NE(output.find("elastic: worker " + id + " (pid " + std::to_string(pid) + "): "),
              std::string::npos)
        << output;
  }
  return survivors;
}

}  // namespace ddp::testing
