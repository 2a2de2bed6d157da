# What gtest_register.cmake and gtest_groups.cmake share.

# A GoogleTest filter as a regular expression of the whole name.
function(ddp_filter_regex filter out)
  string(REGEX REPLACE "([.+^$()|\\[\\]\\\\])" "\\\\\\1" regex "${filter}")
  string(REPLACE "*" ".*" regex "${regex}")
  string(REPLACE "?" "." regex "${regex}")
  set(${out} "^${regex}$" PARENT_SCOPE)
endfunction()

# The regular expressions of a filter's patterns (joined by ':', positive ones only: ddp_add_gtest
# takes no '-').
function(ddp_filter_regexes filter out)
  set(regexes "")
  string(REPLACE ":" ";" patterns "${filter}")
  foreach(pattern IN LISTS patterns)
    ddp_filter_regex("${pattern}" regex)
    list(APPEND regexes "${regex}")
  endforeach()
  set(${out} "${regexes}" PARENT_SCOPE)
endfunction()

# TRUE in `out` where `name` matches one of `regexes`.
function(ddp_matches_any name regexes out)
  foreach(regex IN LISTS regexes)
    if(name MATCHES "${regex}")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} FALSE PARENT_SCOPE)
endfunction()

# Every test of `program` (its --gtest_list_tests), its exit code and error output. The listing is
# kept beside the program, in <program>.gtest-list, and read from there while the program is not
# newer: a program that links LibTorch takes about 0.4 s of CPU to start, and ctest would start
# ddp_job_tests once for each of its 12 groups, on each run of ctest (the platform labels' test runs
# another). --gtest_filter=* overrides a GTEST_FILTER of the environment, which would be kept too.
function(ddp_gtest_list program out result errors)
  set(cache "${program}.gtest-list")
  set(listing_errors "")
  if(EXISTS "${cache}" AND NOT "${program}" IS_NEWER_THAN "${cache}")
    file(READ "${cache}" listing)
    set(listed 0)
  else()
    execute_process(COMMAND "${program}" --gtest_list_tests --gtest_filter=*
                    OUTPUT_VARIABLE listing ERROR_VARIABLE listing_errors RESULT_VARIABLE listed
                    TIMEOUT 60)
    if(listed EQUAL 0)
      # Written whole, then renamed: another ctest (the labels' test) may read it at any time.
      string(RANDOM LENGTH 12 tag)
      file(WRITE "${cache}.${tag}" "${listing}")
      file(RENAME "${cache}.${tag}" "${cache}")
    endif()
  endif()
  set(${out} "${listing}" PARENT_SCOPE)
  set(${result} "${listed}" PARENT_SCOPE)
  set(${errors} "${listing_errors}" PARENT_SCOPE)
endfunction()
