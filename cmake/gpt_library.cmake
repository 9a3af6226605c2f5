# gpt_folder_library(<target> [SUBDIRS dir...] [EXCLUDE file...] [PUBLIC dep...] [PRIVATE dep...]): one
# source folder as one static library, from the .cpp files of the folder that calls it (and of SUBDIRS),
# built with the project's warnings. Each folder's CMakeLists.txt names the folders it depends on through
# PUBLIC, so the library graph is the include graph: app -> parallel/* -> data -> model.
function(gpt_folder_library target)
  cmake_parse_arguments(ARG "" "" "SUBDIRS;EXCLUDE;PUBLIC;PRIVATE" ${ARGN})
  set(globs ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  foreach(dir IN LISTS ARG_SUBDIRS)
    list(APPEND globs ${CMAKE_CURRENT_SOURCE_DIR}/${dir}/*.cpp)
  endforeach()
  file(GLOB sources CONFIGURE_DEPENDS ${globs})
  foreach(file IN LISTS ARG_EXCLUDE)
    list(REMOVE_ITEM sources ${CMAKE_CURRENT_SOURCE_DIR}/${file})
  endforeach()
  add_library(${target} STATIC ${sources})
  target_compile_options(${target} PRIVATE ${GPT_WARNINGS})
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC} PRIVATE ${ARG_PRIVATE})
endfunction()
