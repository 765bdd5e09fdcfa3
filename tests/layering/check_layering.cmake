# cmake -P script: the folder layering of README.md's Layout section. For each
# library folder, every `#include "folder/..."` of the project must name the
# folder itself or one of the folders listed for it below. Fails listing each
# offending line.
#
# The lists are the arrows that exist, not every folder that happens to sit
# lower: a new arrow is a decision, made by editing this table (and README.md's
# picture), never by an include slipping in. An arrow exists where a folder
# uses another's types, whether it includes their header or gets it through
# a third folder's: executor/ builds a JobSpec, a Machine (job/) and a
# LoadedModel (models/) for its demo plan input, and cli/ holds Graphs
# (graph/), both through estimators/ headers, so their rows list those
# folders. They form a DAG, leaves first:
#
#   common <- graph <- {hardware, models};  common <- allocator
#   {graph, allocator} <- replay <- layout
#   {hardware, models, allocator} <- job <- planner
#   {planner, job, replay} <- estimators <- {report, executor} <- cli;  layout <- report
#   estimators <- serving <- report
#
# Notably: planner/ needs neither allocator/ nor replay/ (the static layout of
# a plan or a trace is layout/'s), nor hardware/ or models/ (a job's checkpoint
# mode is all it takes from job/); executor/ needs no GPU catalog or cost
# model (hardware/); layout/ and planner/ are side by side, and only report/
# and cli/ join them.
cmake_minimum_required(VERSION 3.25)

set(uses_common "")
set(uses_graph common)
set(uses_allocator common)
set(uses_replay graph allocator common)
set(uses_layout replay graph allocator common)
set(uses_hardware graph common)
set(uses_models graph common)
set(uses_job hardware models graph allocator common)
set(uses_planner job graph common)
set(uses_estimators planner job hardware models graph replay allocator common)
set(uses_serving estimators planner job hardware models graph replay allocator common)
set(uses_report serving estimators planner layout job hardware models graph replay allocator common)
set(uses_executor estimators planner job models graph replay allocator common)
set(uses_cli executor report serving estimators planner layout job hardware models graph replay allocator common)
set(folders common graph allocator replay layout hardware models job planner estimators serving report executor cli)

set(violations "")
# A library folder left out of the table would go unchecked.
file(GLOB libraries RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/*/CMakeLists.txt)
foreach(list_file IN LISTS libraries)
  get_filename_component(folder ${list_file} DIRECTORY)
  file(STRINGS ${SOURCE_DIR}/${list_file} declares REGEX "^headroom_library\\(")
  if(declares AND NOT folder IN_LIST folders)
    string(APPEND violations "  ${folder}/ builds a library but has no row in tests/layering/check_layering.cmake\n")
  endif()
endforeach()

foreach(folder IN LISTS folders)
  set(allowed ${folder} ${uses_${folder}})
  file(GLOB_RECURSE sources ${SOURCE_DIR}/${folder}/*.h ${SOURCE_DIR}/${folder}/*.cc ${SOURCE_DIR}/${folder}/*.cu)
  foreach(source IN LISTS sources)
    file(STRINGS ${source} includes REGEX "^#include \"[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" target "${line}")
      if(NOT target IN_LIST folders)
        continue()  # a dependency's header (absl/, boost/, ...)
      endif()
      if(NOT target IN_LIST allowed)
        file(RELATIVE_PATH where ${SOURCE_DIR} ${source})
        string(APPEND violations "  ${where}: ${line} (${folder}/ may include: ${allowed})\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "a folder includes one its row does not list:\n${violations}")
endif()
message(STATUS "layering: every include follows an arrow of the table")
