#pragma once
// A header that one source includes, in a unity batch.
#define PLAIN_VALUE 1
