# Compiles the GLSL compute kernels to SPIR-V at build time and embeds them in the binary.
# kernels/variants.txt lists one SPIR-V module per line:   <name> <file.comp> [-DDEFINE=VALUE ...]
# (blank lines and lines starting with # are ignored). Shared code lives in kernels/*.glsl includes.
# The generated lmtune_kernels.cpp provides lmtune::vk::embedded_spirv(name).
set(LMTUNE_KERNEL_DIR ${CMAKE_SOURCE_DIR}/kernels)
set(LMTUNE_SPV_DIR ${CMAKE_BINARY_DIR}/spv)
file(MAKE_DIRECTORY ${LMTUNE_SPV_DIR})
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${LMTUNE_KERNEL_DIR}/variants.txt)

file(GLOB LMTUNE_GLSL_INCLUDES CONFIGURE_DEPENDS ${LMTUNE_KERNEL_DIR}/*.glsl)
file(STRINGS ${LMTUNE_KERNEL_DIR}/variants.txt _variant_lines)
set(LMTUNE_SPV_FILES "")
set(LMTUNE_SPV_NAMES "")
foreach(line IN LISTS _variant_lines)
  string(STRIP "${line}" line)
  if(line STREQUAL "" OR line MATCHES "^#")
    continue()
  endif()
  separate_arguments(parts UNIX_COMMAND "${line}")
  list(POP_FRONT parts name src)
  set(out ${LMTUNE_SPV_DIR}/${name}.spv)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${GLSLC} --target-env=vulkan1.2 -I${LMTUNE_KERNEL_DIR} ${parts} ${LMTUNE_KERNEL_DIR}/${src} -o ${out}
    DEPENDS ${LMTUNE_KERNEL_DIR}/${src} ${LMTUNE_GLSL_INCLUDES} ${LMTUNE_KERNEL_DIR}/variants.txt
    COMMENT "glslc ${name}"
    VERBATIM)
  list(APPEND LMTUNE_SPV_FILES ${out})
  list(APPEND LMTUNE_SPV_NAMES ${name})
endforeach()

set(LMTUNE_KERNELS_CPP ${CMAKE_BINARY_DIR}/lmtune_kernels.cpp)
add_custom_command(
  OUTPUT ${LMTUNE_KERNELS_CPP}
  COMMAND ${CMAKE_COMMAND} -DOUT=${LMTUNE_KERNELS_CPP} -DSPV_DIR=${LMTUNE_SPV_DIR} "-DNAMES=${LMTUNE_SPV_NAMES}"
          -P ${CMAKE_SOURCE_DIR}/cmake/embed_spirv.cmake
  DEPENDS ${LMTUNE_SPV_FILES} ${CMAKE_SOURCE_DIR}/cmake/embed_spirv.cmake
  COMMENT "embedding ${CMAKE_BINARY_DIR}/spv/*.spv"
  VERBATIM)
add_custom_target(lmtune_kernels DEPENDS ${LMTUNE_KERNELS_CPP})
set_source_files_properties(${LMTUNE_KERNELS_CPP} PROPERTIES GENERATED TRUE)
