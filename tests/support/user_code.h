#pragma once
// What ddp_fault_train's delay fault runs: a function of the "user's" code, in a file of its own
// compiled with debug info as a user's RelWithDebInfo build is (the rest of the program reuses
// the precompiled header, built without): the hang doctor's stack report names the function,
// this file and the line of its wait.

#include <string>

// Logs "rank R: fault: waiting S s WHERE (in wait_in_user_code, user_code.cpp:LINE)", LINE being
// the line of the sleep that follows, then sleeps `seconds`.
void wait_in_user_code(double seconds, int rank, const std::string& where);
