# Run by ctest (a TEST_INCLUDE_FILES script, see ddp_add_gtest's BY_SUITE in tests/CMakeLists.txt)
# with DDP_SUITES_PROGRAM, DDP_SUITES_CMAKE and DDP_SUITES_PROPERTIES set by the file that
# includes it: registers one test per GoogleTest suite of the program, `Suite.*`, which runs that
# suite's tests in one process. For programs of many short in-process tests: a process that links
# LibTorch takes about 0.8 s of CPU to start, longer than most of those tests take.
execute_process(COMMAND "${DDP_SUITES_PROGRAM}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE listing_errors RESULT_VARIABLE listed
                TIMEOUT 60)
if(NOT listed EQUAL 0)
  # Registered as a test that fails saying why, as gtest_discover_tests does.
  get_filename_component(program "${DDP_SUITES_PROGRAM}" NAME)
  add_test("${program}_NOT_LISTED" "${DDP_SUITES_CMAKE}" -E echo
           "${DDP_SUITES_PROGRAM} --gtest_list_tests failed (${listed}): ${listing_errors}")
  set_tests_properties("${program}_NOT_LISTED" PROPERTIES WILL_FAIL TRUE)
  return()
endif()
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  # A suite's line starts in column 1 and ends with its '.' (a typed suite's adds "  # TypeParam").
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    set(name "${suite}.*")
    add_test("${name}" "${DDP_SUITES_PROGRAM}" "--gtest_filter=${suite}.*")
    set_tests_properties("${name}" PROPERTIES ${DDP_SUITES_PROPERTIES})
  endif()
endforeach()
