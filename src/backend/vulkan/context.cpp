// Vulkan loader, instance, device discovery and per-device contexts (see context.h).
#include "backend/vulkan/context.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "backend/vulkan/allocator.h"
#include "backend/vulkan/environment.h"
#include "backend/vulkan/pipelines.h"
#include "backend/vulkan/recorder.h"
#include "core/error.h"

namespace lmtune::vk {

// ---------------------------------------------------------------------------------------------------- loader

bool load_vulkan_library(std::string& why) {
  static void* lib = nullptr;
  if (lib) return true;
  for (const char* name : {"libvulkan.so.1", "libvulkan.so", "libvulkan.1.dylib", "libMoltenVK.dylib"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
  }
  if (!lib) {
    why = "no Vulkan loader (libvulkan.so.1) found";
    return false;
  }
  vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  if (!vkGetInstanceProcAddr) {
    why = "the Vulkan loader has no vkGetInstanceProcAddr";
    return false;
  }
#define LMTUNE_VK_LOAD(name) name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(nullptr, #name));
  LMTUNE_VK_GLOBAL_FUNCTIONS(LMTUNE_VK_LOAD)
#undef LMTUNE_VK_LOAD
  if (!vkCreateInstance || !vkEnumerateInstanceExtensionProperties) {
    why = "the Vulkan loader lacks vkCreateInstance";
    return false;
  }
  return true;
}

std::string load_instance_functions(VkInstance inst) {
  std::string missing;
#define LMTUNE_VK_LOAD(name)                                                          \
  name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(inst, #name));            \
  if (!name && missing.empty()) missing = #name;
  LMTUNE_VK_INSTANCE_FUNCTIONS(LMTUNE_VK_LOAD)
#undef LMTUNE_VK_LOAD
#define LMTUNE_VK_LOAD(name) name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(inst, #name));
  LMTUNE_VK_OPTIONAL_FUNCTIONS(LMTUNE_VK_LOAD)
#undef LMTUNE_VK_LOAD
  return missing;
}

const char* result_name(VkResult r) {
  switch (r) {
#define C(x) case x: return #x;
    C(VK_SUCCESS) C(VK_NOT_READY) C(VK_TIMEOUT) C(VK_INCOMPLETE) C(VK_ERROR_OUT_OF_HOST_MEMORY)
    C(VK_ERROR_OUT_OF_DEVICE_MEMORY) C(VK_ERROR_INITIALIZATION_FAILED) C(VK_ERROR_DEVICE_LOST)
    C(VK_ERROR_MEMORY_MAP_FAILED) C(VK_ERROR_LAYER_NOT_PRESENT) C(VK_ERROR_EXTENSION_NOT_PRESENT)
    C(VK_ERROR_FEATURE_NOT_PRESENT) C(VK_ERROR_INCOMPATIBLE_DRIVER) C(VK_ERROR_TOO_MANY_OBJECTS)
    C(VK_ERROR_FORMAT_NOT_SUPPORTED) C(VK_ERROR_FRAGMENTED_POOL) C(VK_ERROR_UNKNOWN) C(VK_ERROR_OUT_OF_POOL_MEMORY)
    C(VK_ERROR_INVALID_SHADER_NV)
#undef C
    default: return "VkResult error";
  }
}

void check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return;
  std::string msg = std::string("vulkan: ") + what + " failed: " + result_name(r) + " (" + std::to_string(int(r)) + ")";
  if (r == VK_ERROR_DEVICE_LOST)
    throw DeviceError(msg + "; the GPU was lost (driver reset, hang or fault): results are gone, restart the run");
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) throw OutOfMemoryError(msg);
  throw DeviceError(msg);
}

// ---------------------------------------------------------------------------------------------------- instance

namespace {

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

std::vector<VkExtensionProperties> device_extensions(VkPhysicalDevice pd) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> v(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, v.data());
  return v;
}

// Features named in LMTUNE_VK_DISABLE are treated as absent: for testing fallbacks.
bool disabled(const char* feature) { return vulkan_environment().is_disabled(feature); }

struct InstanceState {
  VkInstance instance = VK_NULL_HANDLE;
  std::vector<VkPhysicalDevice> devices;
};

// Created once, never destroyed: contexts may outlive any static destructor order we could choose.
InstanceState& instance_state() {
  static InstanceState* st = [] {
    auto* s = new InstanceState;
    std::string why;
    if (!load_vulkan_library(why)) {
      spdlog::warn("Vulkan unavailable: {}; only the CPU backend can be used", why);
      return s;
    }
    uint32_t version = VK_API_VERSION_1_0;
    if (vkEnumerateInstanceVersion) vkEnumerateInstanceVersion(&version);
    if (version < VK_API_VERSION_1_1) {
      spdlog::warn("Vulkan unavailable: the loader supports only Vulkan 1.0 (1.1 needed)");
      return s;
    }
    uint32_t n = 0;
    vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
    std::vector<VkExtensionProperties> exts(n);
    vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
    std::vector<const char*> enable;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    if (has_extension(exts, "VK_KHR_portability_enumeration")) {  // MoltenVK
      enable.push_back("VK_KHR_portability_enumeration");
      ci.flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
    }
    std::vector<const char*> layers;
    if (vulkan_environment().validation) {
      uint32_t nl = 0;
      if (vkEnumerateInstanceLayerProperties) vkEnumerateInstanceLayerProperties(&nl, nullptr);
      std::vector<VkLayerProperties> ls(nl);
      if (nl) vkEnumerateInstanceLayerProperties(&nl, ls.data());
      bool found = std::any_of(ls.begin(), ls.end(), [](const VkLayerProperties& l) {
        return std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
      });
      if (found) layers.push_back("VK_LAYER_KHRONOS_validation");
      else spdlog::warn("LMTUNE_VK_VALIDATION=1 but VK_LAYER_KHRONOS_validation is not installed; running without it");
    }
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "lmtune";
    app.pEngineName = "lmtune";
    app.apiVersion = std::min<uint32_t>(version, VK_API_VERSION_1_3);  // 1.3: the SPIR-V 1.6 kernels
    ci.pApplicationInfo = &app;
    ci.enabledExtensionCount = uint32_t(enable.size());
    ci.ppEnabledExtensionNames = enable.data();
    ci.enabledLayerCount = uint32_t(layers.size());
    ci.ppEnabledLayerNames = layers.data();
    VkResult r = vkCreateInstance(&ci, nullptr, &s->instance);
    if (r != VK_SUCCESS) {
      spdlog::warn("Vulkan unavailable: vkCreateInstance failed ({}); only the CPU backend can be used",
                   result_name(r));
      s->instance = VK_NULL_HANDLE;
      return s;
    }
    if (std::string missing = load_instance_functions(s->instance); !missing.empty()) {
      spdlog::warn("Vulkan unavailable: the loader lacks {}", missing);
      s->instance = VK_NULL_HANDLE;
      return s;
    }
    uint32_t nd = 0;
    vkEnumeratePhysicalDevices(s->instance, &nd, nullptr);
    s->devices.resize(nd);
    if (nd) vkEnumeratePhysicalDevices(s->instance, &nd, s->devices.data());
    // Devices below Vulkan 1.2 lack the feature structs and SPIR-V 1.5 our kernels use.
    std::erase_if(s->devices, [](VkPhysicalDevice pd) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(pd, &p);
      if (p.apiVersion >= VK_API_VERSION_1_2) return false;
      spdlog::warn("Vulkan device '{}' supports only Vulkan {}.{}; lmtune needs 1.2, skipping it", p.deviceName,
                   VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion));
      return true;
    });
    if (s->devices.empty()) spdlog::warn("Vulkan: no usable device found; only the CPU backend can be used");
    return s;
  }();
  return *st;
}

// The NV cooperative-matrix configuration our kernels use: f16 x f16 + f32 -> f32, 16x16x16, subgroup scope.
bool has_coopmat_f16_16x16x16(VkPhysicalDevice pd, const std::vector<VkExtensionProperties>& exts) {
  if (!has_extension(exts, "VK_NV_cooperative_matrix") || !vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)
    return false;
  uint32_t n = 0;
  if (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, nullptr) != VK_SUCCESS || n == 0) return false;
  std::vector<VkCooperativeMatrixPropertiesNV> v(n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  if (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, v.data()) != VK_SUCCESS) return false;
  for (const auto& c : v)
    if (c.MSize == 16 && c.NSize == 16 && c.KSize == 16 && c.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
        c.BType == VK_COMPONENT_TYPE_FLOAT16_NV && c.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
        c.DType == VK_COMPONENT_TYPE_FLOAT32_NV && c.scope == VK_SCOPE_SUBGROUP_NV)
      return true;
  return false;
}

// Feature structs of extensions newer than Debian 12's Vulkan headers (1.3.239), as the registry defines them.
struct CoopMatFeaturesKHR {  // VK_KHR_cooperative_matrix
  VkStructureType sType = VkStructureType(1000506000);
  void* pNext = nullptr;
  VkBool32 cooperativeMatrix = VK_FALSE, cooperativeMatrixRobustBufferAccess = VK_FALSE;
};
struct CoopMat2FeaturesNV {  // VK_NV_cooperative_matrix2
  VkStructureType sType = VkStructureType(1000593000);
  void* pNext = nullptr;
  VkBool32 workgroupScope = VK_FALSE, flexibleDimensions = VK_FALSE, reductions = VK_FALSE, conversions = VK_FALSE,
           perElementOperations = VK_FALSE, tensorAddressing = VK_FALSE, blockLoads = VK_FALSE;
};
struct Bfloat16FeaturesKHR {  // VK_KHR_shader_bfloat16
  VkStructureType sType = VkStructureType(1000141000);
  void* pNext = nullptr;
  VkBool32 shaderBFloat16Type = VK_FALSE, shaderBFloat16DotProduct = VK_FALSE,
           shaderBFloat16CooperativeMatrix = VK_FALSE;
};

// Everything we query about a physical device, with its feature structs chained for vkCreateDevice.
struct DeviceQuery {
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  VkPhysicalDevice16BitStorageFeatures s16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  VkPhysicalDeviceShaderFloat16Int8Features f16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDeviceVulkanMemoryModelFeatures mm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT af{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV cm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  CoopMatFeaturesKHR cmk;
  CoopMat2FeaturesNV cm2;
  VkPhysicalDeviceBufferDeviceAddressFeatures bdaf{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES};
  bool bda = false;
  Bfloat16FeaturesKHR bf16;
  std::vector<VkExtensionProperties> exts;
  bool coopmat_config = false;
  uint64_t device_local = 0;

  explicit DeviceQuery(VkPhysicalDevice pd) {
    exts = device_extensions(pd);
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &subgroup;
    subgroup.pNext = &driver;
    vkGetPhysicalDeviceProperties2(pd, &p2);
    props = p2.properties;
    f2.pNext = &s16;
    s16.pNext = &f16;
    f16.pNext = &mm;
    void** tail = &mm.pNext;
    if (has_extension(exts, "VK_EXT_shader_atomic_float")) {
      *tail = &af;
      tail = &af.pNext;
    }
    if (has_extension(exts, "VK_NV_cooperative_matrix")) {
      *tail = &cm;
      tail = &cm.pNext;
    }
    if (has_extension(exts, "VK_KHR_cooperative_matrix") && has_extension(exts, "VK_NV_cooperative_matrix2")) {
      *tail = &cmk;
      cmk.pNext = &cm2;
      cm2.pNext = &bdaf;
      tail = &bdaf.pNext;
    }
    if (has_extension(exts, "VK_KHR_shader_bfloat16")) {
      *tail = &bf16;
      tail = &bf16.pNext;
    }
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    bda = bdaf.bufferDeviceAddress;
    coopmat_config = has_coopmat_f16_16x16x16(pd, exts);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryHeapCount; ++i)
      if (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        device_local = std::max<uint64_t>(device_local, mp.memoryHeaps[i].size);
  }
  bool coopmat() const {
    return cm.cooperativeMatrix && coopmat_config && f16.shaderFloat16 && mm.vulkanMemoryModel &&
           s16.storageBuffer16BitAccess && !disabled("cooperative_matrix");
  }
  bool coopmat2() const {
    return coopmat() && props.apiVersion >= VK_API_VERSION_1_3 && cmk.cooperativeMatrix && cm2.workgroupScope &&
           cm2.flexibleDimensions && cm2.tensorAddressing && cm2.blockLoads && f2.features.shaderInt16 && bda &&
           !disabled("cooperative_matrix2");
  }
  bool bf16_coopmat() const {
    return coopmat2() && bf16.shaderBFloat16Type && bf16.shaderBFloat16CooperativeMatrix && !disabled("bfloat16");
  }
};

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

struct QueueFamily {
  uint32_t index, timestamp_bits;
};

// The first queue family with compute (on most drivers the universal one, fastest for copies too).
QueueFamily compute_queue_family(VkPhysicalDevice phys, const std::string& name) {
  uint32_t nf = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(phys, &nf, nullptr);
  std::vector<VkQueueFamilyProperties> fams(nf);
  vkGetPhysicalDeviceQueueFamilyProperties(phys, &nf, fams.data());
  for (uint32_t i = 0; i < nf; ++i)
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return {i, fams[i].timestampValidBits};
  throw DeviceError(name + " has no compute queue");
}

// What we use of what the device has (minus LMTUNE_VK_DISABLE).
Features enabled_features(const DeviceQuery& q, uint32_t timestamp_bits) {
  Features f;
  f.subgroup_size = q.subgroup.subgroupSize;
  f.subgroup_arithmetic = (q.subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                          (q.subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                          !disabled("subgroup_arithmetic");
  f.timestamp_bits = timestamp_bits;
  f.timestamps = f.timestamp_bits > 0 && q.props.limits.timestampPeriod > 0;
  f.storage_16bit = q.s16.storageBuffer16BitAccess && !disabled("storage_16bit");
  f.fp16_arithmetic = q.f16.shaderFloat16 && !disabled("fp16_arithmetic");
  f.int16 = q.f2.features.shaderInt16;
  f.vulkan_memory_model = q.mm.vulkanMemoryModel;
  f.push_descriptor = has_extension(q.exts, "VK_KHR_push_descriptor") && vkCmdPushDescriptorSetKHR &&
                      !disabled("push_descriptor");
  f.memory_budget = has_extension(q.exts, "VK_EXT_memory_budget") && !disabled("memory_budget");
  f.atomic_float_add = has_extension(q.exts, "VK_EXT_shader_atomic_float") && q.af.shaderBufferFloat32AtomicAdd &&
                       !disabled("atomic_float");
  f.cooperative_matrix = q.coopmat();
  f.cooperative_matrix2 = q.coopmat2();
  f.bf16_cooperative_matrix = q.bf16_coopmat();
  f.host_mapping = !disabled("host_mapping");
  f.pipeline_stats = vulkan_environment().pipeline_stats &&
                     has_extension(q.exts, "VK_KHR_pipeline_executable_properties") &&
                     vkGetPipelineExecutableStatisticsKHR && vkGetPipelineExecutablePropertiesKHR;
  return f;
}

// The feature structs vkCreateDevice reads through its pNext chain, and the extensions to enable, for the
// features f; the chain points into this object, which must outlive the call.
struct DeviceFeatureChain {
  VkPhysicalDeviceFeatures2 e2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  VkPhysicalDevice16BitStorageFeatures e16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  VkPhysicalDeviceShaderFloat16Int8Features ef16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDeviceVulkanMemoryModelFeatures emm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT eaf{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV ecm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  CoopMatFeaturesKHR ecmk;
  CoopMat2FeaturesNV ecm2;
  VkPhysicalDeviceBufferDeviceAddressFeatures ebda{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES};
  Bfloat16FeaturesKHR ebf;
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR epe{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  std::vector<const char*> exts;
  void** tail = nullptr;

  DeviceFeatureChain(const DeviceFeatureChain&) = delete;
  DeviceFeatureChain(const DeviceQuery& q, const Features& f) {
    e2.features.shaderInt16 = f.int16;
    e16.storageBuffer16BitAccess = f.storage_16bit;
    e16.uniformAndStorageBuffer16BitAccess = f.storage_16bit && q.s16.uniformAndStorageBuffer16BitAccess;
    ef16.shaderFloat16 = f.fp16_arithmetic;
    emm.vulkanMemoryModel = q.mm.vulkanMemoryModel;
    emm.vulkanMemoryModelDeviceScope = q.mm.vulkanMemoryModelDeviceScope;
    e2.pNext = &e16;
    e16.pNext = &ef16;
    ef16.pNext = &emm;
    tail = &emm.pNext;
    eaf.shaderBufferFloat32AtomicAdd = VK_TRUE;
    if (f.atomic_float_add) append("VK_EXT_shader_atomic_float", &eaf, &eaf.pNext);
    ecm.cooperativeMatrix = VK_TRUE;
    if (f.cooperative_matrix) append("VK_NV_cooperative_matrix", &ecm, &ecm.pNext);
    ecmk.cooperativeMatrix = VK_TRUE;
    ecm2 = q.cm2;  // what the device has (the kernels use block loads' decode functions too)
    // The decode functions take a buffer reference (SPIR-V's physical storage buffer addressing).
    ebda.bufferDeviceAddress = VK_TRUE;
    if (f.cooperative_matrix2) {
      exts.push_back("VK_KHR_cooperative_matrix");
      ecmk.pNext = &ecm2;
      ecm2.pNext = &ebda;
      append("VK_NV_cooperative_matrix2", &ecmk, &ebda.pNext);
    }
    ebf.shaderBFloat16Type = ebf.shaderBFloat16CooperativeMatrix = VK_TRUE;
    if (f.bf16_cooperative_matrix) append("VK_KHR_shader_bfloat16", &ebf, &ebf.pNext);
    epe.pipelineExecutableInfo = VK_TRUE;
    if (f.pipeline_stats) append("VK_KHR_pipeline_executable_properties", &epe, &epe.pNext);
    if (f.push_descriptor) exts.push_back("VK_KHR_push_descriptor");
    if (f.memory_budget) exts.push_back("VK_EXT_memory_budget");
    if (has_extension(q.exts, "VK_KHR_portability_subset")) exts.push_back("VK_KHR_portability_subset");
  }
  // Enables `ext` and links the struct `head` (whose last pNext is `next`) at the chain's end.
  void append(const char* ext, void* head, void** next) {
    exts.push_back(ext);
    *tail = head;
    tail = next;
  }
};

VkDevice create_device(VkPhysicalDevice phys, const DeviceQuery& q, const Features& f, uint32_t queue_family,
                       const std::string& name) {
  DeviceFeatureChain chain(q, f);
  float priority = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = queue_family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.pNext = &chain.e2;
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  di.enabledExtensionCount = uint32_t(chain.exts.size());
  di.ppEnabledExtensionNames = chain.exts.data();
  VkDevice device = VK_NULL_HANDLE;
  check(vkCreateDevice(phys, &di, nullptr, &device), ("vkCreateDevice(" + name + ")").c_str());
  return device;
}

// Fallbacks are loud: one line each, once per device.
void log_fallbacks(const std::string& name, const Features& f) {
  if (!f.storage_16bit) spdlog::info("{}: no 16-bit storage; f16/bf16 kernels use the packed-uint32 fallback", name);
  if (!f.push_descriptor) spdlog::info("{}: no VK_KHR_push_descriptor; using descriptor pools", name);
  if (!f.memory_budget) spdlog::info("{}: no VK_EXT_memory_budget; the heap size is the memory budget", name);
  if (!f.atomic_float_add)
    spdlog::info("{}: no float atomic add; embedding backward uses a compare-and-swap loop", name);
  if (!f.cooperative_matrix) spdlog::info("{}: no cooperative matrices; matmul uses the scalar kernels", name);
  if (!f.timestamps) spdlog::info("{}: no timestamp queries; kernel profiling is unavailable", name);
}

std::mutex g_contexts_mu;
std::set<Context*> g_contexts;

}  // namespace

VkInstance instance() { return instance_state().instance; }
std::vector<VkPhysicalDevice> physical_devices() { return instance_state().devices; }

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  auto devs = physical_devices();
  for (size_t i = 0; i < devs.size(); ++i) {
    DeviceQuery q(devs[i]);
    DeviceInfo d;
    d.index = int(i);
    d.name = q.props.deviceName;
    d.type = type_name(q.props.deviceType);
    d.memory_bytes = q.device_local;
    d.subgroup_size = q.subgroup.subgroupSize;
    d.fp16_arithmetic = q.f16.shaderFloat16;
    d.storage_16bit = q.s16.storageBuffer16BitAccess;
    d.cooperative_matrix = q.coopmat();
    d.driver = std::string(q.driver.driverName) + " " + q.driver.driverInfo;
    out.push_back(std::move(d));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------- context

Context::Context(int index) : index_(index) {
  auto devs = physical_devices();
  if (index < 0 || index >= int(devs.size()))
    throw DeviceError("vulkan:" + std::to_string(index) + " does not exist (" + std::to_string(devs.size()) +
                      " Vulkan device(s) found; see `lmtune info`)");
  phys_ = devs[size_t(index)];
  DeviceQuery q(phys_);
  props_ = q.props;
  vkGetPhysicalDeviceMemoryProperties(phys_, &mem_props_);
  name_ = "vulkan:" + std::to_string(index) + " (" + props_.deviceName + ")";
  const QueueFamily family = compute_queue_family(phys_, name_);
  queue_family_ = family.index;
  features_ = enabled_features(q, family.timestamp_bits);
  device_ = create_device(phys_, q, features_, queue_family_, name_);
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  log_fallbacks(name_, features_);

  allocator_ = std::make_unique<Allocator>(*this);
  recorder_ = std::make_unique<Recorder>(*this);
  pipelines_ = std::make_unique<Pipelines>(*this);
  std::lock_guard lock(g_contexts_mu);
  g_contexts.insert(this);
}

Context::~Context() {
  {
    std::lock_guard lock(g_contexts_mu);
    g_contexts.erase(this);
  }
  recorder_.reset();  // waits for all work
  pipelines_.reset();
  allocator_.reset();
  vkDestroyDevice(device_, nullptr);
}

void Context::dispatch_raw(const std::string& kernel, const std::vector<Binding>& bindings, const void* push,
                           size_t push_bytes, Groups groups, const std::vector<uint32_t>& spec) {
  if (push_bytes > kPushConstantBytes) throw DeviceError("vulkan: push constants of '" + kernel + "' exceed 128 bytes");
  if (groups[0] == 0 || groups[1] == 0 || groups[2] == 0) return;
  const auto& lim = props_.limits.maxComputeWorkGroupCount;
  if (groups[0] > lim[0] || groups[1] > lim[1] || groups[2] > lim[2])
    throw DeviceError(name_ + ": kernel '" + kernel + "' dispatch of " + std::to_string(groups[0]) + "x" +
                      std::to_string(groups[1]) + "x" + std::to_string(groups[2]) +
                      " workgroups exceeds the device limit");
  std::lock_guard lock(mu_);
  const Pipeline& p = pipelines_->get(kernel, uint32_t(bindings.size()), spec);
  recorder_->dispatch(p, bindings, push, push_bytes, groups, kernel);
}

void Context::fill_buffer(const Binding& b, uint32_t value) {
  std::lock_guard lock(mu_);
  recorder_->fill(b, value);
}

void Context::synchronize() {
  std::lock_guard lock(mu_);
  recorder_->wait_all();
}

std::string profile_report() {
  {
    std::lock_guard lock(g_contexts_mu);
    for (Context* c : g_contexts) c->synchronize();
  }
  auto stats = profile_stats();
  std::vector<std::pair<std::string, KernelStats>> rows(stats.begin(), stats.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ns > b.second.ns; });
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %8s %12s %12s\n", "kernel", "calls", "total ms", "mean us");
  out += line;
  double total = 0;
  for (auto& [name, s] : rows) {
    std::snprintf(line, sizeof line, "%-32s %8llu %12.3f %12.2f\n", name.c_str(),
                  static_cast<unsigned long long>(s.calls), s.ns * 1e-6, s.calls ? s.ns * 1e-3 / double(s.calls) : 0.0);
    out += line;
    total += s.ns;
  }
  std::snprintf(line, sizeof line, "%-32s %8s %12.3f\n", "total", "", total * 1e-6);
  out += line;
  const BatchStats b = batch_stats();
  std::snprintf(line, sizeof line, "%-32s %8llu %12.3f   (first to last command: kernels, gaps, copies)\n",
                "GPU batch spans", static_cast<unsigned long long>(b.batches), b.span_ns * 1e-6);
  out += line;
  std::snprintf(line, sizeof line, "%-32s %8llu %12.3f\n", "host waits on fences",
                static_cast<unsigned long long>(b.waits), b.wait_ns * 1e-6);
  out += line;
  return out;
}

}  // namespace lmtune::vk
