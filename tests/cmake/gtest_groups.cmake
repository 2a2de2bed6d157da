# Run by ctest (a TEST_INCLUDE_FILES script that ddp_check_groups in tests/CMakeLists.txt generates
# for a program whose tests are registered in groups): a test of the program that no group's filter
# takes would run nowhere, so then a test is registered that fails naming each such test.
#
# Set by the file that includes it:
#   DDP_GTEST_PROGRAM  the program
#   DDP_GTEST_GROUPS   the groups' filters, joined by ':'
#   DDP_GTEST_CMAKE    cmake, for the failing test
include("${CMAKE_CURRENT_LIST_DIR}/gtest_filter.cmake")
get_filename_component(program "${DDP_GTEST_PROGRAM}" NAME)
ddp_gtest_list("${DDP_GTEST_PROGRAM}" listing listed listing_errors)
if(NOT listed EQUAL 0)
  return()  # each group's registration names that failure
endif()
ddp_filter_regexes("${DDP_GTEST_GROUPS}" regexes)
set(suite "")
set(orphans "")
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([^ #]+)" AND NOT suite STREQUAL "")
    set(name "${suite}.${CMAKE_MATCH_1}")
    ddp_matches_any("${name}" "${regexes}" taken)
    if(NOT taken)
      list(APPEND orphans "${name}")
    endif()
  endif()
endforeach()
if(orphans)
  list(JOIN orphans ", " orphans)
  add_test("${program}_TESTS_IN_NO_GROUP" "${DDP_GTEST_CMAKE}" -E echo
           "${program}: no group's FILTER (tests/CMakeLists.txt) takes ${orphans}")
  set_tests_properties("${program}_TESTS_IN_NO_GROUP" PROPERTIES WILL_FAIL TRUE)
endif()
