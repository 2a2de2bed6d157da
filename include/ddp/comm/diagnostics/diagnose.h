#pragma once
// The hang doctor: merges the ranks' flight records (comm/flight_recorder.h) into one
// report that names the rank(s) that lagged, the first collective they did not enter (or entered
// only after the others had given up on it), and the phase of the training step it belongs to.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/flight_recorder.h"

namespace ddp::comm {

struct FlightDump {
  std::string file;
  int rank = 0;
  int world_size = 1;
  std::string reason;  // why it was written: the error, or SIGUSR1
  double time = 0.0;   // when it was written
  std::string phase;   // the phase the rank was in then
  uint64_t last_issued = 0;
  std::vector<CollectiveRecord> collectives;  // oldest first
  std::optional<WaitingIn> waiting_in;        // where its stacks were taken, if they were
  std::string straggler;  // the last straggler named before it was written ("" for none)
};

// Parses one rank<r>.json. Throws InputError naming `file` when it is not a flight record, and
// where: the line and column of a JSON syntax error, the field that is missing or of a wrong type.
FlightDump parse_flight_dump(const std::string& text, const std::string& file);

// The records in `dir`/debug (or in `dir` itself when it holds rank*.json files), by rank.
// Throws InputError when there are none or one does not parse.
std::vector<FlightDump> read_flight_dumps(const std::string& dir);

// How ranks ended, where the caller knows (the launcher: rank -> "signal SIGKILL (9)").
using RankEnds = std::map<int, std::string>;

// The report, several lines ending with the diagnosis. A pure function of the dumps and of
// `ended`, which names how the ranks that left no record ended. A rank without a record (killed
// before it could write one, or never asked) may or may not have entered a collective: the
// diagnosis then speaks of "every rank with a record", names the ranks without one and says what
// that leaves unknown; it claims "every rank" only when every rank left a record. Where the
// records hold a straggler named before the stall, the newest one's line ends the report
// ("before the stall, straggler: rank 1 computes ...").
std::string diagnose(const std::vector<FlightDump>& dumps, const RankEnds& ended = {});

}  // namespace ddp::comm
