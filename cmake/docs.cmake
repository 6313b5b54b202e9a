# The API reference (Doxygen): `cmake --build build --target docs` when doxygen is installed
# (Debian: doxygen). docs/Doxyfile.in says what it demands of the headers; warnings are errors.
# Included from the top-level CMakeLists.txt after XGRAD_INCLUDE_DIR is set.
find_package(Doxygen QUIET)
find_package(Python3 QUIET COMPONENTS Interpreter)
if(DOXYGEN_FOUND AND Python3_Interpreter_FOUND)
  # Every installed header: the .hpp files directly in the engine's core/, io/, ops/, nn/, and
  # checks/, text/, runs/, distributed/, train/ when they are built (internal headers live in subfolders such
  # as detail/ and are never read), through the build tree's include folder so that the pages
  # show <xgrad/...> include lines. Then the umbrella header and the Markdown pages. The same
  # rule as the install rules (CMakeLists.txt).
  set(xgrad_doc_dirs core io ops nn)
  if(XGRAD_BUILD_CHECKS)
    list(APPEND xgrad_doc_dirs checks)
  endif()
  if(XGRAD_BUILD_TRAIN)
    list(APPEND xgrad_doc_dirs text runs distributed train)
  endif()
  set(xgrad_doc_headers)
  foreach(dir IN LISTS xgrad_doc_dirs)
    file(GLOB headers RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.hpp)
    list(SORT headers)
    list(APPEND xgrad_doc_headers ${headers})
  endforeach()
  list(APPEND xgrad_doc_headers xgrad.hpp xtensor.hpp)
  set(xgrad_doc_inputs)
  set(xgrad_doc_depends)
  foreach(h IN LISTS xgrad_doc_headers)
    list(APPEND xgrad_doc_inputs "\"${XGRAD_INCLUDE_DIR}/xgrad/${h}\"")
    list(APPEND xgrad_doc_depends ${PROJECT_SOURCE_DIR}/${h})
  endforeach()
  file(GLOB xgrad_doc_pages CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
  list(SORT xgrad_doc_pages)
  list(PREPEND xgrad_doc_pages ${PROJECT_SOURCE_DIR}/README.md)
  foreach(page IN LISTS xgrad_doc_pages)
    list(APPEND xgrad_doc_inputs "\"${page}\"")
    list(APPEND xgrad_doc_depends ${page})
  endforeach()
  list(JOIN xgrad_doc_inputs " \\\n                         " XGRAD_DOXYGEN_INPUT)

  set(XGRAD_DOCS_OUTPUT ${PROJECT_BINARY_DIR}/docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${XGRAD_DOCS_OUTPUT}/Doxyfile @ONLY)
  add_custom_target(docs
    COMMAND ${DOXYGEN_EXECUTABLE} ${XGRAD_DOCS_OUTPUT}/Doxyfile
    WORKING_DIRECTORY ${XGRAD_DOCS_OUTPUT}
    DEPENDS ${xgrad_doc_depends} ${XGRAD_DOCS_OUTPUT}/Doxyfile
    COMMENT "API reference (Doxygen): ${XGRAD_DOCS_OUTPUT}/html/index.html"
    VERBATIM)
  set(XGRAD_DOCS_TARGET ON)
else()
  set(XGRAD_DOCS_TARGET OFF)
endif()
