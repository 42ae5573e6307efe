# Each floor must be closed over the floors below it: a call that climbs a floor (core calling into
# comm, data into layers, ...) is a link error, not a convention. For every floor a shared object is
# linked from the whole of its archive plus only what that floor declares it links, with
# --no-undefined, so any symbol it needs from a floor above is reported by the linker at build time.
# (Static archives alone would not catch it: an executable links all floors and resolves anything.)
# The runtime floor is checked area by area (runtime/CMakeLists.txt): an area may call only the areas below it.
# Skipped under the sanitizers, whose runtimes are not linked into shared objects.
if(NOT RINGTRAIN_SANITIZE)
  file(WRITE ${PROJECT_BINARY_DIR}/layer_check_empty.cpp "// linked only to check a floor's closure\n")
  foreach(floor ringtrain_core ringtrain_io ringtrain_optim ringtrain_data ringtrain_layers ringtrain_comm ${RINGTRAIN_RUNTIME_AREAS})
    add_library(${floor}_closure_check SHARED ${PROJECT_BINARY_DIR}/layer_check_empty.cpp)
    target_link_libraries(${floor}_closure_check PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${floor}>")
    target_link_options(${floor}_closure_check PRIVATE -Wl,--no-undefined)
    set_target_properties(${floor}_closure_check PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/layer_check)
  endforeach()
endif()
