# Run by ctest (a TEST_INCLUDE_FILES script that ddp_add_gtest in tests/CMakeLists.txt generates
# for each GoogleTest program): lists the program's tests and registers them, each with the label
# of the platforms that run it (docs/design.md, "Build and CI time").
#
# Set by the file that includes it:
#   DDP_GTEST_PROGRAM     the program
#   DDP_GTEST_GROUP       the name of what is registered: the program's, or a group's of its tests
#   DDP_GTEST_FILTER      the group's tests (a GoogleTest filter); empty: every test of the program
#   DDP_GTEST_CMAKE       cmake, for the test that fails when the program cannot list its tests
#   DDP_GTEST_PROPERTIES  properties of every test (TIMEOUT, RESOURCE_LOCK...), labels aside
#   DDP_GTEST_LABELS      labels of every test (the platform's is added to them)
#   DDP_GTEST_PLATFORMS   the program's platform label: both-platforms or debian12-only
#   DDP_GTEST_ON_BOTH     filters (GoogleTest's: * and ?) of the tests that run on both platforms
#                         where the program's label is debian12-only
#   DDP_GTEST_BY_SUITE    ON: every suite is one test (`Suite.*`, one process): for programs of
#                         short in-process tests, as a process that links LibTorch takes about 1 s
#                         of CPU to start, longer than most of those tests take
#   DDP_GTEST_SHARED      NAME=FILTER...: the tests FILTER names (a GoogleTest filter, patterns
#                         joined by ':') are one test NAME, one process, so that they can share
#                         what they start: one launch of ranks for several scenarios (support/
#                         scenarios.h). GoogleTest's output still names each test that failed.
#   DDP_GTEST_ALONE       filters of the tests that run with no other test beside them
#                         (RUN_SERIAL); only for tests registered on their own
# Every other test is registered on its own, as GoogleTest's gtest_discover_tests does, under its
# GoogleTest name, a value-parameterised test's index replaced by its value as gtest_discover_tests
# does (Worlds/GlooRanks.X/2, not .../0); a test that calls GTEST_SKIP() shows as skipped.
include("${CMAKE_CURRENT_LIST_DIR}/gtest_filter.cmake")
ddp_gtest_list("${DDP_GTEST_PROGRAM}" listing listed listing_errors)
set(program "${DDP_GTEST_GROUP}")
if(NOT listed EQUAL 0)
  # Registered as a test that fails saying why, as gtest_discover_tests does.
  add_test("${program}_NOT_LISTED" "${DDP_GTEST_CMAKE}" -E echo
           "${DDP_GTEST_PROGRAM} --gtest_list_tests failed (${listed}): ${listing_errors}")
  set_tests_properties("${program}_NOT_LISTED" PROPERTIES WILL_FAIL TRUE)
  return()
endif()
# The group's tests, where it is a group of the program's (the whole listing is the program's).
ddp_filter_regexes("${DDP_GTEST_FILTER}" group_regexes)

list(JOIN DDP_GTEST_ON_BOTH ":" on_both)
ddp_filter_regexes("${on_both}" both_regexes)
list(JOIN DDP_GTEST_ALONE ":" alone)
ddp_filter_regexes("${alone}" alone_regexes)

# Each shared test's name, filter and patterns (as regexes: shared_<i>_regexes).
set(shared_names "")
set(shared_index 0)
foreach(entry IN LISTS DDP_GTEST_SHARED)
  string(FIND "${entry}" "=" eq)
  string(SUBSTRING "${entry}" 0 ${eq} shared_name)
  math(EXPR after "${eq} + 1")
  string(SUBSTRING "${entry}" ${after} -1 shared_filter)
  list(APPEND shared_names "${shared_name}")
  set("shared_${shared_index}_filter" "${shared_filter}")
  ddp_filter_regexes("${shared_filter}" "shared_${shared_index}_regexes")
  math(EXPR shared_index "${shared_index} + 1")
endforeach()

# The index of the shared test that takes `name`, or -1.
function(ddp_shared_of name out)
  set(index 0)
  foreach(shared_name IN LISTS shared_names)
    ddp_matches_any("${name}" "${shared_${index}_regexes}" taken)
    if(taken)
      set(${out} ${index} PARENT_SCOPE)
      return()
    endif()
    math(EXPR index "${index} + 1")
  endforeach()
  set(${out} -1 PARENT_SCOPE)
endfunction()

# A test that stands for several (a shared one, a suite): their platforms must agree.
function(ddp_group_platform group name platform)
  if(DEFINED "group_platform_${group}" AND NOT "${group_platform_${group}}" STREQUAL platform)
    add_test("${group}.PLATFORMS_DIFFER" "${DDP_GTEST_CMAKE}" -E echo
             "${program}: ${group} is one test, but ${name} runs on ${platform} and another of "
             "its tests on ${group_platform_${group}}")
    set_tests_properties("${group}.PLATFORMS_DIFFER" PROPERTIES WILL_FAIL TRUE)
  endif()
  set("group_platform_${group}" "${platform}" PARENT_SCOPE)
endfunction()

function(ddp_platform_of name out)
  set(label "${DDP_GTEST_PLATFORMS}")
  ddp_matches_any("${name}" "${both_regexes}" on_both)
  if(on_both)
    set(label both-platforms)
  endif()
  set(${out} "${label}" PARENT_SCOPE)
endfunction()

set(suite "")
set(suites_seen "")
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  # A suite's line starts in column 1 and ends with its '.' (a typed suite's adds "  # TypeParam");
  # a test's is indented, a parameterised one's followed by "  # GetParam() = ...".
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    continue()
  endif()
  if(NOT line MATCHES "^  ([^ #]+)" OR suite STREQUAL "")
    continue()
  endif()
  set(test "${CMAKE_MATCH_1}")
  if(test MATCHES "^DISABLED_" OR suite MATCHES "(^|/)DISABLED_")
    continue()
  endif()
  set(filter_name "${suite}.${test}")  # what --gtest_filter takes
  if(group_regexes)
    ddp_matches_any("${filter_name}" "${group_regexes}" in_group)
    if(NOT in_group)
      continue()
    endif()
  endif()
  set(name "${filter_name}")
  if(line MATCHES "^  [^ ]+/[0-9]+  # GetParam\\(\\) = (.*)$")
    string(REGEX REPLACE "/[0-9]+$" "/${CMAKE_MATCH_1}" name "${filter_name}")
  endif()
  ddp_platform_of("${name}" platform)
  ddp_shared_of("${name}" shared)
  if(shared GREATER -1)
    list(GET shared_names ${shared} shared_name)
    ddp_group_platform("${shared_name}" "${name}" "${platform}")
    continue()
  endif()
  if(DDP_GTEST_BY_SUITE)
    ddp_group_platform("${suite}.*" "${name}" "${platform}")
    list(FIND suites_seen "${suite}" seen)  # (not IN_LIST: ctest runs this without its policy)
    if(seen EQUAL -1)
      list(APPEND suites_seen "${suite}")
    endif()
    continue()
  endif()
  set(labels ${DDP_GTEST_LABELS} ${platform})
  add_test("${name}" "${DDP_GTEST_PROGRAM}" "--gtest_filter=${filter_name}")
  set_tests_properties("${name}" PROPERTIES ${DDP_GTEST_PROPERTIES} LABELS "${labels}"
                       SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  ddp_matches_any("${name}" "${alone_regexes}" alone)
  if(alone)
    set_tests_properties("${name}" PROPERTIES RUN_SERIAL TRUE)
  endif()
endforeach()

# A suite's or a shared test fails if any of its tests fails (GoogleTest's exit code); its output
# names each test that failed, and every one of them runs.
function(ddp_add_group name filter)
  if(NOT DEFINED "group_platform_${name}")
    return()  # no test of the program matched
  endif()
  set(labels ${DDP_GTEST_LABELS} ${group_platform_${name}})
  add_test("${name}" "${DDP_GTEST_PROGRAM}" "--gtest_filter=${filter}")
  set_tests_properties("${name}" PROPERTIES ${DDP_GTEST_PROPERTIES} LABELS "${labels}")
endfunction()
foreach(suite IN LISTS suites_seen)
  ddp_add_group("${suite}.*" "${suite}.*")
endforeach()
set(index 0)
foreach(shared_name IN LISTS shared_names)
  ddp_add_group("${shared_name}" "${shared_${index}_filter}")
  math(EXPR index "${index} + 1")
endforeach()
