# Compiles the GLSL compute kernels to SPIR-V at build time and embeds them in the binary.
# kernels/variants.txt lists one SPIR-V module per line:   <name> <family/file.comp> [-DDEFINE=VALUE ...]
# (blank lines and lines starting with # are ignored; paths relative to kernels/). Kernels live in one folder per
# family (attention/, matmul/, ...); shared code lives in .glsl includes, which name their path relative to kernels/
# as well (#include "common/common.glsl"). Every module depends on every include, so the glob must see them all.
# The generated lmtune_kernels.cpp provides lmtune::vk::embedded_spirv(name).
set(LMTUNE_KERNEL_DIR ${CMAKE_SOURCE_DIR}/kernels)
set(LMTUNE_SPV_DIR ${CMAKE_BINARY_DIR}/spv)
file(MAKE_DIRECTORY ${LMTUNE_SPV_DIR})
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${LMTUNE_KERNEL_DIR}/variants.txt)

file(GLOB_RECURSE LMTUNE_GLSL_INCLUDES CONFIGURE_DEPENDS ${LMTUNE_KERNEL_DIR}/*.glsl)
file(STRINGS ${LMTUNE_KERNEL_DIR}/variants.txt _variant_lines)
set(LMTUNE_SPV_FILES "")
set(LMTUNE_SPV_NAMES "")
# One line of a variants file: sets skip (blank or comment), else name, src, parts (the compiler's arguments) and
# out (the module's path), and lists the module for embedding.
macro(lmtune_variant_line line)
  string(STRIP "${line}" _line)
  set(skip FALSE)
  if(_line STREQUAL "" OR _line MATCHES "^#")
    set(skip TRUE)
  else()
    separate_arguments(parts UNIX_COMMAND "${_line}")
    list(POP_FRONT parts name src)
    set(out ${LMTUNE_SPV_DIR}/${name}.spv)
    list(APPEND LMTUNE_SPV_FILES ${out})
    list(APPEND LMTUNE_SPV_NAMES ${name})
  endif()
endmacro()
foreach(line IN LISTS _variant_lines)
  lmtune_variant_line("${line}")
  if(skip)
    continue()
  endif()
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${GLSLC} --target-env=vulkan1.2 -I${LMTUNE_KERNEL_DIR} ${parts} ${LMTUNE_KERNEL_DIR}/${src} -o ${out}
    DEPENDS ${LMTUNE_KERNEL_DIR}/${src} ${LMTUNE_GLSL_INCLUDES} ${LMTUNE_KERNEL_DIR}/variants.txt
    COMMENT "glslc ${name}"
    VERBATIM)
endforeach()

# Kernels for workgroup-scope cooperative matrices (kernels/variants_cm2.txt) need glslang 15 (GL_NV_cooperative_
# matrix2), which scripts/build_glslang.sh builds from Debian 13's sources into a cache outside the tree. Lines
# ending in `bf16` are compiled with float16_t and then turned into bfloat16 modules by lmtune_spirv_bfloat16
# (cmake/spirv_bfloat16.cpp). Without glslang 15 the build goes on without them and the runtime says so.
set(_tool_cache "$ENV{XDG_CACHE_HOME}")
if(NOT _tool_cache)
  set(_tool_cache "$ENV{HOME}/.cache")
endif()
find_program(LMTUNE_GLSLANG15 glslang PATHS "${_tool_cache}/lmtune/glslang-15/bin" NO_DEFAULT_PATH
             DOC "glslang 15 (scripts/build_glslang.sh) for the GL_NV_cooperative_matrix2 kernels")
set(LMTUNE_HAVE_CM2_KERNELS OFF)
if(LMTUNE_GLSLANG15)
  execute_process(COMMAND ${LMTUNE_GLSLANG15} --version OUTPUT_VARIABLE _glslang_version ERROR_QUIET)
  if(_glslang_version MATCHES "Glslang Version: [0-9]+:([0-9]+)" AND CMAKE_MATCH_1 GREATER_EQUAL 15)
    set(LMTUNE_HAVE_CM2_KERNELS ON)
  endif()
endif()
if(LMTUNE_HAVE_CM2_KERNELS)
  message(STATUS "cooperative-matrix-2 kernels: ${LMTUNE_GLSLANG15}")
  add_executable(lmtune_spirv_bfloat16 ${CMAKE_SOURCE_DIR}/cmake/spirv_bfloat16.cpp)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${LMTUNE_KERNEL_DIR}/variants_cm2.txt)
  file(STRINGS ${LMTUNE_KERNEL_DIR}/variants_cm2.txt _cm2_lines)
  foreach(line IN LISTS _cm2_lines)
    lmtune_variant_line("${line}")
    if(skip)
      continue()
    endif()
    list(GET parts -1 last)
    if(last STREQUAL "bf16")
      list(POP_BACK parts)
      add_custom_command(
        OUTPUT ${out}
        COMMAND ${LMTUNE_GLSLANG15} -V --quiet --target-env vulkan1.3 -I${LMTUNE_KERNEL_DIR} ${parts}
                ${LMTUNE_KERNEL_DIR}/${src} -o ${out}.f16
        COMMAND lmtune_spirv_bfloat16 ${out}.f16 ${out}
        DEPENDS ${LMTUNE_KERNEL_DIR}/${src} ${LMTUNE_GLSL_INCLUDES} ${LMTUNE_KERNEL_DIR}/variants_cm2.txt
                lmtune_spirv_bfloat16
        COMMENT "glslang ${name} (bfloat16)"
        VERBATIM)
    else()
      add_custom_command(
        OUTPUT ${out}
        COMMAND ${LMTUNE_GLSLANG15} -V --quiet --target-env vulkan1.3 -I${LMTUNE_KERNEL_DIR} ${parts}
                ${LMTUNE_KERNEL_DIR}/${src} -o ${out}
        DEPENDS ${LMTUNE_KERNEL_DIR}/${src} ${LMTUNE_GLSL_INCLUDES} ${LMTUNE_KERNEL_DIR}/variants_cm2.txt
        COMMENT "glslang ${name}"
        VERBATIM)
    endif()
  endforeach()
else()
  message(WARNING "glslang 15 not found (run scripts/build_glslang.sh): building without the cooperative-matrix-2 "
                  "kernels; products take the VK_NV_cooperative_matrix ones")
endif()

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
