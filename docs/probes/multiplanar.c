// Probe (not project code): does a plane of an OPTIMAL-tiling multi-planar Vulkan image, exported as an
// OPAQUE_FD, map into CUDA as a CUDA array with exact texels?
//
// Formats: VK_FORMAT_G8_B8R8_2PLANE_420_UNORM (NV12-like) and VK_FORMAT_G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16
// (P010-like), at 256x128 and 1920x1080, plus single-plane controls (R8, R8G8, R16, R16G16 OPTIMAL images
// through the same path) so that "multi-planar is different" can be told apart from "the method is wrong".
// For each image: Vulkan uploads a known pattern (luma Y = x*7+y*13, chroma Cb = x*3+y, Cr = x+y*5; 8-bit:
// & 0xff; 10-bit: & 0x3ff, stored in the top 10 bits of a 16-bit word) with vkCmdCopyBufferToImage per plane,
// reads it back with Vulkan (control), releases the image to VK_QUEUE_FAMILY_EXTERNAL in GENERAL layout,
// exports the memory as an opaque fd, imports it with cuImportExternalMemory and tries these routes:
//   joint (one VkDeviceMemory for the whole image, dedicated when the driver asks):
//     planes@0       plane 0 as UINT8x1 / UINT16x1 WxH array at offset 0; plane 1 as x2 (W/2 x H/2) at offset 0
//     plane1@guess   plane 1 at offsets guessed from the disjoint variant's plane-0 memory size
//     plane1-scan    plane 1 at every multiple of the memory alignment, then every 512 bytes (15 s cap per image),
//                    to find where, if anywhere, the chroma plane is exact
//     whole-NV12 / whole-P010 / whole-P016   the whole memory as ONE multi-planar CUDA array (NumChannels 3,
//                    then 1, then 2), planes taken with cuMipmappedArrayGetLevel + cuArrayGetPlane(0/1)
//   disjoint (VK_IMAGE_CREATE_DISJOINT_BIT, one VkDeviceMemory per plane, each exported and imported):
//     per-plane@0    each plane's memory mapped as its own array at offset 0
// Every CUDA array is copied back to the host with cuMemcpy3D and compared texel by texel.
// Output: one line per step; at the end one "SUMMARY" line per (format, size, variant, route[, plane]) saying
// MAPS-EXACT / MAPS-EXACT-TOP10 (10-bit: top 10 bits exact) / MAPS-WRONG-TEXELS / REFUSED <CUresult>.
//
// Build (here: gcc, Debian's libvulkan-dev headers, the CUDA driver header; libcuda is dlopen'ed, not linked):
//   gcc -O2 -s -Wall -Wextra -I/work/main/target/xtask-cuda-header -o docs/probes/multiplanar docs/probes/multiplanar.c -lvulkan -ldl
//   (from /work/main; apt-get install libvulkan-dev if <vulkan/vulkan.h> is missing)
// Run on the GPU machine, from the repo root (needs the NVIDIA Vulkan ICD and libcuda.so.1; no display):
//   VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ./docs/probes/multiplanar
// What to look for: the "SUMMARY ..." lines at the end; "Vulkan readback plane N: exact" (the Vulkan side holds the
// pattern); the R8/R8G8/R16/R16G16 control lines (MAPS-EXACT there = the import/array method itself is sound).
// Optional: ./docs/probes/multiplanar quick   (256x128 only, no 1920x1080).  A watchdog ends the run after 300 s;
// every Vulkan wait is bounded at 5 s.  Exit status 0 when it ran to the end (whatever the answers were).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vulkan/vulkan.h>
#include "cuda.h"

static const char *vkr(VkResult r) {
  switch (r) {
#define C(x) case x: return #x;
    C(VK_SUCCESS) C(VK_NOT_READY) C(VK_TIMEOUT) C(VK_INCOMPLETE) C(VK_ERROR_OUT_OF_HOST_MEMORY)
    C(VK_ERROR_OUT_OF_DEVICE_MEMORY) C(VK_ERROR_INITIALIZATION_FAILED) C(VK_ERROR_DEVICE_LOST)
    C(VK_ERROR_MEMORY_MAP_FAILED) C(VK_ERROR_LAYER_NOT_PRESENT) C(VK_ERROR_EXTENSION_NOT_PRESENT)
    C(VK_ERROR_FEATURE_NOT_PRESENT) C(VK_ERROR_INCOMPATIBLE_DRIVER) C(VK_ERROR_TOO_MANY_OBJECTS)
    C(VK_ERROR_FORMAT_NOT_SUPPORTED) C(VK_ERROR_FRAGMENTED_POOL) C(VK_ERROR_UNKNOWN) C(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    C(VK_ERROR_OUT_OF_POOL_MEMORY)
#undef C
    default: return "VkResult(?)";
  }
}
static CUresult (*cu_err_name)(CUresult, const char **);
static const char *cur(CUresult r) {
  static char buf[8][64]; static int k;
  const char *s = 0;
  if (cu_err_name && cu_err_name(r, &s) != CUDA_SUCCESS) s = 0;
  k = (k + 1) & 7;
  if (s) snprintf(buf[k], sizeof buf[k], "%s", s); else snprintf(buf[k], sizeof buf[k], "CUresult(%d)", (int)r);
  return buf[k];
}

// Setup steps: fail hard.  Test steps: report and carry on.
#define VK(x) do { VkResult r_ = (x); if (r_ != VK_SUCCESS) { printf("FAIL %s = %d %s (line %d)\n", #x, r_, vkr(r_), __LINE__); fflush(stdout); exit(1); } } while (0)
#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("FAIL %s = %d %s (line %d)\n", #x, r_, cur(r_), __LINE__); fflush(stdout); exit(1); } } while (0)
#define VKT(x, label) do { VkResult r_ = (x); if (r_ != VK_SUCCESS) { printf("  FAIL %s: %s = %d %s\n", label, #x, r_, vkr(r_)); fflush(stdout); goto out; } } while (0)

#define DECL(f) static __typeof__(f) *p_##f
DECL(cuInit); DECL(cuDriverGetVersion); DECL(cuDeviceGetCount); DECL(cuDeviceGet); DECL(cuDeviceGetName);
DECL(cuDeviceGetUuid); DECL(cuDevicePrimaryCtxRetain); DECL(cuDevicePrimaryCtxRelease); DECL(cuCtxSetCurrent);
DECL(cuCtxSynchronize); DECL(cuImportExternalMemory); DECL(cuDestroyExternalMemory);
DECL(cuExternalMemoryGetMappedMipmappedArray); DECL(cuMipmappedArrayGetLevel); DECL(cuMipmappedArrayDestroy);
DECL(cuArrayGetPlane); DECL(cuArray3DGetDescriptor); DECL(cuMemcpy3D);
static void *lib;
static void *sym(const char *n) { void *p = dlsym(lib, n); if (!p) { printf("FAIL libcuda lacks %s\n", n); exit(1); } return p; }
#define LOAD(f, s) p_##f = (__typeof__(p_##f))sym(s)

static void watchdog(int s) {
  (void)s;
  static const char m[] = "\nFAIL watchdog: probe ran past 300 s, exiting (something blocked)\n";
  if (write(1, m, sizeof m - 1) < 0) {}
  _exit(3);
}
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static char summary[200][512]; static int nsum;
#define SUM(...) do { if (nsum < 200) snprintf(summary[nsum++], sizeof summary[0], __VA_ARGS__); } while (0)

// ---------------------------------------------------------------- formats and the pattern
typedef struct { int wdiv, hdiv, ch; } Plane;
typedef struct {
  const char *name; VkFormat vk; int nplanes; int bpc; Plane pl[2];
  int nwhole; CUarray_format whole[2]; const char *whole_name[2];
} Fmt;
static const Fmt fmts[] = {
  {"G8_B8R8_2PLANE_420_UNORM", VK_FORMAT_G8_B8R8_2PLANE_420_UNORM, 2, 1, {{1, 1, 1}, {2, 2, 2}},
   1, {CU_AD_FORMAT_NV12}, {"NV12"}},
  {"G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16", VK_FORMAT_G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16, 2, 2,
   {{1, 1, 1}, {2, 2, 2}}, 2, {CU_AD_FORMAT_P010, CU_AD_FORMAT_P016}, {"P010", "P016"}},
  {"R8_UNORM(control,luma-shaped)", VK_FORMAT_R8_UNORM, 1, 1, {{1, 1, 1}}, 0, {0}, {0}},
  {"R8G8_UNORM(control,chroma-shaped)", VK_FORMAT_R8G8_UNORM, 1, 1, {{2, 2, 2}}, 0, {0}, {0}},
  {"R16_UNORM(control,luma-shaped)", VK_FORMAT_R16_UNORM, 1, 2, {{1, 1, 1}}, 0, {0}, {0}},
  {"R16G16_UNORM(control,chroma-shaped)", VK_FORMAT_R16G16_UNORM, 1, 2, {{2, 2, 2}}, 0, {0}, {0}},
};
#define NFMT (int)(sizeof fmts / sizeof fmts[0])

static unsigned pat(int ch_total, int c, int x, int y, int bpc) {
  unsigned v = ch_total == 1 ? (unsigned)(x * 7 + y * 13) : c == 0 ? (unsigned)(x * 3 + y) : (unsigned)(x + y * 5);
  return bpc == 1 ? (v & 0xff) : ((v & 0x3ff) << 6);
}
static void fill(void *dst, int w, int h, int ch, int bpc) {
  for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) for (int c = 0; c < ch; c++) {
    size_t i = ((size_t)y * w + x) * ch + c; unsigned v = pat(ch, c, x, y, bpc);
    if (bpc == 1) ((uint8_t *)dst)[i] = (uint8_t)v; else ((uint16_t *)dst)[i] = (uint16_t)v;
  }
}
// Returns mismatching texels (any channel differs); *top10 gets those differing in the top 10 bits (16-bit only).
static char mism[1024]; // the first mismatches of the last verbose compare()
static long compare(const void *got, int w, int h, int ch, int bpc, int verbose, long *top10) {
  long bad = 0, bad10 = 0; int shown = 0; size_t ml = 0; mism[0] = 0;
  for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) {
    int tb = 0, tb10 = 0;
    for (int c = 0; c < ch; c++) {
      size_t i = ((size_t)y * w + x) * ch + c; unsigned e = pat(ch, c, x, y, bpc);
      unsigned g = bpc == 1 ? ((const uint8_t *)got)[i] : ((const uint16_t *)got)[i];
      if (g != e) {
        tb = 1; if ((g & 0xffc0) != (e & 0xffc0)) tb10 = 1;
        if (verbose && shown < 6 && ml < sizeof mism - 100) {
          ml += (size_t)snprintf(mism + ml, sizeof mism - ml, "      mismatch at (x=%d,y=%d,c=%d): expected 0x%x got 0x%x\n", x, y, c, e, g); shown++; }
      }
    }
    bad += tb; bad10 += tb10;
  }
  if (top10) *top10 = bpc == 2 ? bad10 : bad;
  return bad;
}
static const char *verdict(long bad, long bad10) { return bad == 0 ? "MAPS-EXACT" : bad10 == 0 ? "MAPS-EXACT-TOP10" : "MAPS-WRONG-TEXELS"; }

// ---------------------------------------------------------------- Vulkan state
static VkInstance inst; static VkPhysicalDevice pd; static VkDevice dev; static VkQueue queue; static uint32_t qfam;
static VkCommandPool pool; static VkPhysicalDeviceMemoryProperties memprops;
static PFN_vkGetMemoryFdKHR getMemoryFd;
static CUdevice cudev; static CUcontext cuctx;

static int find_mem(uint32_t bits, VkMemoryPropertyFlags want) {
  for (uint32_t i = 0; i < memprops.memoryTypeCount; i++)
    if ((bits >> i & 1) && (memprops.memoryTypes[i].propertyFlags & want) == want) return (int)i;
  return -1;
}

static void print_features(const char *what, VkFormatFeatureFlags f) {
  printf("  %s features 0x%08x:%s%s%s%s%s%s%s%s\n", what, f,
         f & VK_FORMAT_FEATURE_SAMPLED_IMAGE_BIT ? " SAMPLED_IMAGE" : "",
         f & VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT ? " STORAGE_IMAGE" : "",
         f & VK_FORMAT_FEATURE_TRANSFER_SRC_BIT ? " TRANSFER_SRC" : "",
         f & VK_FORMAT_FEATURE_TRANSFER_DST_BIT ? " TRANSFER_DST" : "",
         f & VK_FORMAT_FEATURE_DISJOINT_BIT ? " DISJOINT" : "",
         f & VK_FORMAT_FEATURE_COLOR_ATTACHMENT_BIT ? " COLOR_ATTACHMENT" : "",
         f & VK_FORMAT_FEATURE_MIDPOINT_CHROMA_SAMPLES_BIT ? " MIDPOINT_CHROMA" : "",
         f & VK_FORMAT_FEATURE_COSITED_CHROMA_SAMPLES_BIT ? " COSITED_CHROMA" : "");
}

// Step 2: format capability queries.
static void query_format(const Fmt *f) {
  printf("\n== format %s (VkFormat %d)\n", f->name, f->vk);
  VkFormatProperties fp; vkGetPhysicalDeviceFormatProperties(pd, f->vk, &fp);
  print_features("OPTIMAL", fp.optimalTilingFeatures);
  print_features("LINEAR ", fp.linearTilingFeatures);
  VkImageUsageFlags base = VK_IMAGE_USAGE_TRANSFER_SRC_BIT | VK_IMAGE_USAGE_TRANSFER_DST_BIT | VK_IMAGE_USAGE_SAMPLED_BIT;
  for (int s = 0; s < 2; s++) for (int d = 0; d < 2; d++) {
    if (d && f->nplanes < 2) continue;
    VkPhysicalDeviceExternalImageFormatInfo ext = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_IMAGE_FORMAT_INFO,
      .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT};
    VkPhysicalDeviceImageFormatInfo2 info = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_IMAGE_FORMAT_INFO_2, .pNext = &ext,
      .format = f->vk, .type = VK_IMAGE_TYPE_2D, .tiling = VK_IMAGE_TILING_OPTIMAL,
      .usage = base | (s ? VK_IMAGE_USAGE_STORAGE_BIT : 0), .flags = d ? VK_IMAGE_CREATE_DISJOINT_BIT : 0};
    VkSamplerYcbcrConversionImageFormatProperties ycc = {.sType = VK_STRUCTURE_TYPE_SAMPLER_YCBCR_CONVERSION_IMAGE_FORMAT_PROPERTIES};
    VkExternalImageFormatProperties eprops = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_IMAGE_FORMAT_PROPERTIES,
      .pNext = f->nplanes > 1 ? &ycc : 0};
    VkImageFormatProperties2 props = {.sType = VK_STRUCTURE_TYPE_IMAGE_FORMAT_PROPERTIES_2, .pNext = &eprops};
    VkResult r = vkGetPhysicalDeviceImageFormatProperties2(pd, &info, &props);
    VkExternalMemoryFeatureFlags em = eprops.externalMemoryProperties.externalMemoryFeatures;
    printf("  ImageFormatProperties2 OPTIMAL usage=%s flags=%s OPAQUE_FD: %d %s", s ? "XFER_SRC|XFER_DST|SAMPLED|STORAGE" : "XFER_SRC|XFER_DST|SAMPLED",
           d ? "DISJOINT" : "0", r, vkr(r));
    if (r == VK_SUCCESS)
      printf("  maxExtent %ux%u  externalMemoryFeatures 0x%x (%s%s%s)  compatibleHandleTypes 0x%x  ycbcrDescriptors %u",
             props.imageFormatProperties.maxExtent.width, props.imageFormatProperties.maxExtent.height, em,
             em & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT ? "DEDICATED_ONLY " : "",
             em & VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT ? "EXPORTABLE " : "",
             em & VK_EXTERNAL_MEMORY_FEATURE_IMPORTABLE_BIT ? "IMPORTABLE" : "",
             eprops.externalMemoryProperties.compatibleHandleTypes, ycc.combinedImageSamplerDescriptorCount);
    printf("\n");
  }
}

// ---------------------------------------------------------------- CUDA array helpers
static CUresult map_array(CUexternalMemory em, unsigned long long off, int w, int h, CUarray_format fmt, int ch,
                          CUmipmappedArray *mm, CUarray *arr) {
  CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC d; memset(&d, 0, sizeof d);
  d.offset = off; d.arrayDesc.Width = (size_t)w; d.arrayDesc.Height = (size_t)h; d.arrayDesc.Depth = 0;
  d.arrayDesc.Format = fmt; d.arrayDesc.NumChannels = (unsigned)ch; d.arrayDesc.Flags = 0; d.numLevels = 1;
  *mm = 0; *arr = 0;
  CUresult r = p_cuExternalMemoryGetMappedMipmappedArray(mm, em, &d);
  if (r != CUDA_SUCCESS) { *mm = 0; return r; }
  r = p_cuMipmappedArrayGetLevel(arr, *mm, 0);
  if (r != CUDA_SUCCESS) { p_cuMipmappedArrayDestroy(*mm); *mm = 0; *arr = 0; }
  return r;
}
static CUresult read_array(CUarray a, void *host, int w, int h, int ch, int bpc) {
  CUDA_MEMCPY3D c; memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = host; c.dstPitch = (size_t)w * ch * bpc; c.dstHeight = (size_t)h;
  c.WidthInBytes = (size_t)w * ch * bpc; c.Height = (size_t)h; c.Depth = 1;
  memset(host, 0xee, (size_t)w * h * ch * bpc);
  return p_cuMemcpy3D(&c);
}
static void describe_array(const char *label, CUarray a) {
  CUDA_ARRAY3D_DESCRIPTOR d; memset(&d, 0, sizeof d);
  CUresult r = p_cuArray3DGetDescriptor(&d, a);
  if (r != CUDA_SUCCESS) { printf("      %s: cuArray3DGetDescriptor = %d %s\n", label, r, cur(r)); return; }
  printf("      %s: CUDA array %zux%zux%zu format 0x%x channels %u flags 0x%x\n", label, d.Width, d.Height, d.Depth,
         (unsigned)d.Format, d.NumChannels, d.Flags);
}
// Reads a mapped array back and compares; prints and records the verdict.
static void check_array(const char *tag, const char *route, CUarray a, int w, int h, int ch, int bpc) {
  size_t n = (size_t)w * h * ch * bpc; void *host = malloc(n);
  CUresult r = read_array(a, host, w, h, ch, bpc);
  if (r != CUDA_SUCCESS) {
    printf("    %s: cuMemcpy3D array->host = %d %s\n", route, r, cur(r));
    SUM("%s route=%s: COPY-FAILED %d %s", tag, route, r, cur(r)); free(host); return;
  }
  long b10; long bad = compare(host, w, h, ch, bpc, 1, &b10);
  if (bad == 0) printf("    %s: exact (%dx%d x%d ch, %d B/ch)\n", route, w, h, ch, bpc);
  else printf("    %s: %ld of %ld texels mismatch (%ld in the top 10 bits)\n%s", route, bad, (long)w * h, b10, mism);
  SUM("%s route=%s: %s", tag, route, verdict(bad, b10));
  free(host);
}

// ---------------------------------------------------------------- one test: (format, size, variant)
typedef struct { int w, h; } Dim;
static Dim plane_dim(const Fmt *f, int W, int H, int p) { Dim d = {W / f->pl[p].wdiv, H / f->pl[p].hdiv}; return d; }
static Dim image_dim(const Fmt *f, int W, int H) { if (f->nplanes == 1) return plane_dim(f, W, H, 0); Dim d = {W, H}; return d; }

static VkDeviceSize disjoint_plane0_size[NFMT][2]; // filled when the disjoint variant ran first (it does)

static void run_test(int fi, int si, int W, int H, int disjoint) {
  const Fmt *f = &fmts[fi];
  Dim id = image_dim(f, W, H);
  char tag[160];
  snprintf(tag, sizeof tag, "fmt=%s size=%dx%d variant=%s", f->name, W, H, f->nplanes == 1 ? "single-plane" : disjoint ? "disjoint" : "joint");
  printf("\n-- %s (image extent %dx%d)\n", tag, id.w, id.h);
  VkImage img = 0; VkDeviceMemory mem[2] = {0}; int nmem = disjoint ? 2 : 1; VkDeviceSize msize[2] = {0}, malign = 512; int dedicated[2] = {0};
  VkBuffer sbuf = 0, rbuf = 0; VkDeviceMemory smem = 0, rmem = 0; VkCommandBuffer cb = 0; VkFence fence = 0;
  CUexternalMemory cem[2] = {0}; int fds[2] = {-1, -1};
  size_t poff[2] = {0}, psz[2] = {0}, total = 0;
  for (int p = 0; p < f->nplanes; p++) { Dim d = plane_dim(f, W, H, p); poff[p] = total; psz[p] = (size_t)d.w * d.h * f->pl[p].ch * f->bpc; total += psz[p]; }

  // Step 3: the exportable image -- only if the driver says this combination is supported.
  VkExternalMemoryFeatureFlags emf = 0;
  {
    VkPhysicalDeviceExternalImageFormatInfo ext = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_IMAGE_FORMAT_INFO,
      .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT};
    VkPhysicalDeviceImageFormatInfo2 info = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_IMAGE_FORMAT_INFO_2, .pNext = &ext,
      .format = f->vk, .type = VK_IMAGE_TYPE_2D, .tiling = VK_IMAGE_TILING_OPTIMAL,
      .usage = VK_IMAGE_USAGE_TRANSFER_SRC_BIT | VK_IMAGE_USAGE_TRANSFER_DST_BIT | VK_IMAGE_USAGE_SAMPLED_BIT,
      .flags = disjoint ? VK_IMAGE_CREATE_DISJOINT_BIT : 0};
    VkExternalImageFormatProperties eprops = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_IMAGE_FORMAT_PROPERTIES};
    VkImageFormatProperties2 props = {.sType = VK_STRUCTURE_TYPE_IMAGE_FORMAT_PROPERTIES_2, .pNext = &eprops};
    VkResult r = vkGetPhysicalDeviceImageFormatProperties2(pd, &info, &props);
    emf = eprops.externalMemoryProperties.externalMemoryFeatures;
    if (r != VK_SUCCESS || !(emf & VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT) ||
        props.imageFormatProperties.maxExtent.width < (uint32_t)id.w || props.imageFormatProperties.maxExtent.height < (uint32_t)id.h) {
      printf("  skipped: vkGetPhysicalDeviceImageFormatProperties2 = %d %s, externalMemoryFeatures 0x%x, maxExtent %ux%u\n", r, vkr(r), emf,
             props.imageFormatProperties.maxExtent.width, props.imageFormatProperties.maxExtent.height);
      SUM("%s: VK-NOT-SUPPORTED (ImageFormatProperties2 %d %s, externalMemoryFeatures 0x%x)", tag, r, vkr(r), emf);
      goto out;
    }
  }
  VkExternalMemoryImageCreateInfo emi = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_IMAGE_CREATE_INFO,
    .handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT};
  VkImageCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO, .pNext = &emi, .flags = disjoint ? VK_IMAGE_CREATE_DISJOINT_BIT : 0,
    .imageType = VK_IMAGE_TYPE_2D, .format = f->vk, .extent = {(uint32_t)id.w, (uint32_t)id.h, 1}, .mipLevels = 1, .arrayLayers = 1,
    .samples = VK_SAMPLE_COUNT_1_BIT, .tiling = VK_IMAGE_TILING_OPTIMAL,
    .usage = VK_IMAGE_USAGE_TRANSFER_SRC_BIT | VK_IMAGE_USAGE_TRANSFER_DST_BIT | VK_IMAGE_USAGE_SAMPLED_BIT,
    .sharingMode = VK_SHARING_MODE_EXCLUSIVE, .initialLayout = VK_IMAGE_LAYOUT_UNDEFINED};
  {
    VkResult r = vkCreateImage(dev, &ici, 0, &img);
    printf("  vkCreateImage(OPTIMAL, %s, external OPAQUE_FD) = %d %s\n", disjoint ? "DISJOINT" : "flags 0", r, vkr(r));
    if (r != VK_SUCCESS) { img = 0; SUM("%s: VK-IMAGE-REFUSED %d %s", tag, r, vkr(r)); goto out; }
  }
  for (int m = 0; m < nmem; m++) {
    VkImagePlaneMemoryRequirementsInfo preq = {.sType = VK_STRUCTURE_TYPE_IMAGE_PLANE_MEMORY_REQUIREMENTS_INFO,
      .planeAspect = m ? VK_IMAGE_ASPECT_PLANE_1_BIT : VK_IMAGE_ASPECT_PLANE_0_BIT};
    VkImageMemoryRequirementsInfo2 ri = {.sType = VK_STRUCTURE_TYPE_IMAGE_MEMORY_REQUIREMENTS_INFO_2, .pNext = disjoint ? &preq : 0, .image = img};
    VkMemoryDedicatedRequirements dr = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_REQUIREMENTS};
    VkMemoryRequirements2 mr = {.sType = VK_STRUCTURE_TYPE_MEMORY_REQUIREMENTS_2, .pNext = &dr};
    vkGetImageMemoryRequirements2(dev, &ri, &mr);
    msize[m] = mr.memoryRequirements.size; if (m == 0 && mr.memoryRequirements.alignment > 512) malign = mr.memoryRequirements.alignment;
    if (disjoint && m == 0) disjoint_plane0_size[fi][si] = (mr.memoryRequirements.size + mr.memoryRequirements.alignment - 1) / mr.memoryRequirements.alignment * mr.memoryRequirements.alignment;
    // A dedicated allocation may not name a DISJOINT image (VUID-VkMemoryDedicatedAllocateInfo-image-01797).
    dedicated[m] = !disjoint && (dr.prefersDedicatedAllocation || dr.requiresDedicatedAllocation || (emf & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT));
    if (disjoint && (emf & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT) && m == 0)
      printf("  NOTE the driver says DEDICATED_ONLY, but a DISJOINT image cannot take a dedicated allocation; allocating plain\n");
    printf("  memory requirements%s: size %llu alignment %llu typeBits 0x%x prefersDedicated %u requiresDedicated %u extDedicatedOnly %d -> %s allocation\n",
           disjoint ? (m ? " (plane 1)" : " (plane 0)") : "", (unsigned long long)mr.memoryRequirements.size,
           (unsigned long long)mr.memoryRequirements.alignment, mr.memoryRequirements.memoryTypeBits,
           dr.prefersDedicatedAllocation, dr.requiresDedicatedAllocation, !!(emf & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT), dedicated[m] ? "dedicated" : "plain");
    int mt = find_mem(mr.memoryRequirements.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (mt < 0) mt = find_mem(mr.memoryRequirements.memoryTypeBits, 0);
    VkMemoryDedicatedAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO, .image = img};
    VkExportMemoryAllocateInfo eai = {.sType = VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO, .pNext = dedicated[m] ? &dai : 0,
      .handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT};
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = &eai, .allocationSize = msize[m], .memoryTypeIndex = (uint32_t)mt};
    VKT(vkAllocateMemory(dev, &mai, 0, &mem[m]), "allocate exportable memory");
  }
  {
    VkBindImagePlaneMemoryInfo bp[2] = {{.sType = VK_STRUCTURE_TYPE_BIND_IMAGE_PLANE_MEMORY_INFO, .planeAspect = VK_IMAGE_ASPECT_PLANE_0_BIT},
                                        {.sType = VK_STRUCTURE_TYPE_BIND_IMAGE_PLANE_MEMORY_INFO, .planeAspect = VK_IMAGE_ASPECT_PLANE_1_BIT}};
    VkBindImageMemoryInfo bi[2];
    for (int m = 0; m < nmem; m++) {
      VkBindImageMemoryInfo b = {.sType = VK_STRUCTURE_TYPE_BIND_IMAGE_MEMORY_INFO, .pNext = disjoint ? &bp[m] : 0, .image = img, .memory = mem[m], .memoryOffset = 0};
      bi[m] = b;
    }
    VKT(vkBindImageMemory2(dev, (uint32_t)nmem, bi), "bind image memory");
  }

  // Step 4: fill known texels with Vulkan (upload), read them back with Vulkan (control), release to EXTERNAL.
  {
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = total,
      .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VKT(vkCreateBuffer(dev, &bci, 0, &sbuf), "staging buffer");
    VKT(vkCreateBuffer(dev, &bci, 0, &rbuf), "readback buffer");
    VkMemoryRequirements br; vkGetBufferMemoryRequirements(dev, sbuf, &br);
    int mt = find_mem(br.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (mt < 0) { printf("  FAIL no host-visible coherent memory type\n"); goto out; }
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = br.size, .memoryTypeIndex = (uint32_t)mt};
    VKT(vkAllocateMemory(dev, &mai, 0, &smem), "staging memory");
    VKT(vkAllocateMemory(dev, &mai, 0, &rmem), "readback memory");
    VKT(vkBindBufferMemory(dev, sbuf, smem, 0), "bind staging");
    VKT(vkBindBufferMemory(dev, rbuf, rmem, 0), "bind readback");
    void *sp; VKT(vkMapMemory(dev, smem, 0, VK_WHOLE_SIZE, 0, &sp), "map staging");
    for (int p = 0; p < f->nplanes; p++) { Dim d = plane_dim(f, W, H, p); fill((char *)sp + poff[p], d.w, d.h, f->pl[p].ch, f->bpc); }
    vkUnmapMemory(dev, smem);

    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VKT(vkAllocateCommandBuffers(dev, &cai, &cb), "command buffer");
    VkCommandBufferBeginInfo cbi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VKT(vkBeginCommandBuffer(cb, &cbi), "begin");
    VkImageSubresourceRange all = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
    VkImageMemoryBarrier b1 = {.sType = VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER, .srcAccessMask = 0, .dstAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
      .oldLayout = VK_IMAGE_LAYOUT_UNDEFINED, .newLayout = VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
      .srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED, .dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED, .image = img, .subresourceRange = all};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 0, 0, 0, 0, 1, &b1);
    VkBufferImageCopy reg[2];
    for (int p = 0; p < f->nplanes; p++) {
      Dim d = plane_dim(f, W, H, p);
      VkImageAspectFlags asp = f->nplanes == 1 ? VK_IMAGE_ASPECT_COLOR_BIT : p ? VK_IMAGE_ASPECT_PLANE_1_BIT : VK_IMAGE_ASPECT_PLANE_0_BIT;
      VkBufferImageCopy r = {.bufferOffset = poff[p], .bufferRowLength = 0, .bufferImageHeight = 0,
        .imageSubresource = {asp, 0, 0, 1}, .imageOffset = {0, 0, 0}, .imageExtent = {(uint32_t)d.w, (uint32_t)d.h, 1}};
      reg[p] = r;
    }
    vkCmdCopyBufferToImage(cb, sbuf, img, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, (uint32_t)f->nplanes, reg);
    VkImageMemoryBarrier b2 = b1; b2.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT; b2.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
    b2.oldLayout = VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL; b2.newLayout = VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 0, 0, 0, 0, 1, &b2);
    vkCmdCopyImageToBuffer(cb, img, VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, rbuf, (uint32_t)f->nplanes, reg);
    // Release to the external (CUDA) side in GENERAL layout.
    VkImageMemoryBarrier b3 = b1; b3.srcAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT; b3.dstAccessMask = 0;
    b3.oldLayout = VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL; b3.newLayout = VK_IMAGE_LAYOUT_GENERAL;
    b3.srcQueueFamilyIndex = qfam; b3.dstQueueFamilyIndex = VK_QUEUE_FAMILY_EXTERNAL;
    VkMemoryBarrier hb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT, .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, 0, 1, &hb, 0, 0, 1, &b3);
    VKT(vkEndCommandBuffer(cb), "end");
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VKT(vkCreateFence(dev, &fci, 0, &fence), "fence");
    VkSubmitInfo si2 = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VKT(vkQueueSubmit(queue, 1, &si2, fence), "submit upload");
    VkResult r = vkWaitForFences(dev, 1, &fence, VK_TRUE, 5000000000ull);
    if (r != VK_SUCCESS) { printf("FAIL upload fence wait (5 s bound) = %d %s; giving up (GPU work may still be in flight)\n", r, vkr(r)); fflush(stdout); exit(1); }
    printf("  PASS Vulkan upload (vkCmdCopyBufferToImage per plane) + fence\n");
    void *rp; VKT(vkMapMemory(dev, rmem, 0, VK_WHOLE_SIZE, 0, &rp), "map readback");
    for (int p = 0; p < f->nplanes; p++) {
      Dim d = plane_dim(f, W, H, p); long b10;
      long bad = compare((char *)rp + poff[p], d.w, d.h, f->pl[p].ch, f->bpc, 1, &b10);
      printf("  Vulkan readback plane %d (%dx%d x%d): %s%s\n%s", p, d.w, d.h, f->pl[p].ch, bad ? "MISMATCH" : "exact",
             bad ? " (the Vulkan side itself is wrong; CUDA results below mean little)" : "", mism);
      if (bad) SUM("%s: VULKAN-READBACK-WRONG plane %d (%ld texels)", tag, p, bad);
    }
    vkUnmapMemory(dev, rmem);
  }

  // Step 5: export, import into CUDA.
  for (int m = 0; m < nmem; m++) {
    VkMemoryGetFdInfoKHR gi = {.sType = VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR, .memory = mem[m], .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT};
    VKT(getMemoryFd(dev, &gi, &fds[m]), "vkGetMemoryFdKHR");
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC hd; memset(&hd, 0, sizeof hd);
    hd.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD; hd.handle.fd = fds[m]; hd.size = msize[m];
    hd.flags = dedicated[m] ? CUDA_EXTERNAL_MEMORY_DEDICATED : 0;
    CUresult r = p_cuImportExternalMemory(&cem[m], &hd);
    printf("  cuImportExternalMemory(OPAQUE_FD, size %llu, flags %s)%s = %d %s\n", (unsigned long long)msize[m],
           dedicated[m] ? "DEDICATED" : "0", disjoint ? (m ? " plane 1" : " plane 0") : "", r, cur(r));
    if (r != CUDA_SUCCESS) { cem[m] = 0; SUM("%s: IMPORT-REFUSED %d %s", tag, r, cur(r)); goto out; }
    fds[m] = -1; // CUDA owns it now
  }

  // Step 5/6: map arrays, read back, compare.
  CUarray_format cfmt = f->bpc == 1 ? CU_AD_FORMAT_UNSIGNED_INT8 : CU_AD_FORMAT_UNSIGNED_INT16;
  const char *cfn = f->bpc == 1 ? "UINT8" : "UINT16";
  if (f->nplanes == 1 || disjoint) {
    for (int p = 0; p < f->nplanes; p++) {
      Dim d = plane_dim(f, W, H, p); CUmipmappedArray mm; CUarray a; char route[96];
      snprintf(route, sizeof route, "%s plane=%d (%s x%d %dx%d @0)", f->nplanes == 1 ? "array@0" : "per-plane@0", p, cfn, f->pl[p].ch, d.w, d.h);
      CUresult r = map_array(cem[disjoint ? p : 0], 0, d.w, d.h, cfmt, f->pl[p].ch, &mm, &a);
      printf("    map %s = %d %s\n", route, r, cur(r));
      if (r != CUDA_SUCCESS) { SUM("%s route=%s: REFUSED %d %s", tag, route, r, cur(r)); continue; }
      check_array(tag, route, a, d.w, d.h, f->pl[p].ch, f->bpc);
      p_cuMipmappedArrayDestroy(mm);
    }
  } else {
    Dim d0 = plane_dim(f, W, H, 0), d1 = plane_dim(f, W, H, 1);
    // (a) each plane as its own array at offset 0.
    for (int p = 0; p < 2; p++) {
      Dim d = p ? d1 : d0; CUmipmappedArray mm; CUarray a; char route[96];
      snprintf(route, sizeof route, "planes@0 plane=%d (%s x%d %dx%d @0)", p, cfn, f->pl[p].ch, d.w, d.h);
      CUresult r = map_array(cem[0], 0, d.w, d.h, cfmt, f->pl[p].ch, &mm, &a);
      printf("    map %s = %d %s\n", route, r, cur(r));
      if (r != CUDA_SUCCESS) { SUM("%s route=%s: REFUSED %d %s", tag, route, r, cur(r)); continue; }
      check_array(tag, route, a, d.w, d.h, f->pl[p].ch, f->bpc);
      p_cuMipmappedArrayDestroy(mm);
    }
    // (a') plane 1 at offsets guessed from the disjoint variant's plane-0 memory size (rounded to its alignment).
    if (disjoint_plane0_size[fi][si]) {
      unsigned long long g = disjoint_plane0_size[fi][si]; CUmipmappedArray mm; CUarray a; char route[96];
      snprintf(route, sizeof route, "plane1@guess plane=1 (%s x2 %dx%d @%llu = disjoint plane-0 size)", cfn, d1.w, d1.h, g);
      CUresult r = map_array(cem[0], g, d1.w, d1.h, cfmt, 2, &mm, &a);
      printf("    map %s = %d %s\n", route, r, cur(r));
      if (r != CUDA_SUCCESS) SUM("%s route=%s: REFUSED %d %s", tag, route, r, cur(r));
      else { check_array(tag, route, a, d1.w, d1.h, 2, f->bpc); p_cuMipmappedArrayDestroy(mm); }
    }
    // (a'') scan plane-1 offsets (alignment steps, then 512-byte steps; 15 s cap) for an exact chroma plane.
    {
      size_t n = (size_t)d1.w * d1.h * 2 * f->bpc; void *host = malloc(n);
      long tried = 0, mapped = 0, refused = 0, best = -1; unsigned long long best_off = 0, exact_off = ~0ull; CUresult first_ref = CUDA_SUCCESS;
      double t0 = now_s(); int capped = 0;
      // Pass 0: every multiple of the image's memory alignment; pass 1: the 512-byte steps in between.
      for (int pass = 0; pass < 2 && exact_off == ~0ull && !capped; pass++) {
        unsigned long long step = pass ? 512 : malign;
        for (unsigned long long off = 0; off < msize[0]; off += step) {
          if (pass && off % malign == 0) continue;
          if (now_s() - t0 > 15) { capped = 1; break; }
          CUmipmappedArray mm; CUarray a; tried++;
          CUresult r = map_array(cem[0], off, d1.w, d1.h, cfmt, 2, &mm, &a);
          if (r != CUDA_SUCCESS) { refused++; if (first_ref == CUDA_SUCCESS) first_ref = r; continue; }
          mapped++;
          if (read_array(a, host, d1.w, d1.h, 2, f->bpc) == CUDA_SUCCESS) {
            long b10, bad = compare(host, d1.w, d1.h, 2, f->bpc, 0, &b10);
            if (best < 0 || bad < best) { best = bad; best_off = off; }
            if (bad == 0) { exact_off = off; p_cuMipmappedArrayDestroy(mm); break; }
          }
          p_cuMipmappedArrayDestroy(mm);
        }
      }
      free(host);
      printf("    plane1-scan (x2 %dx%d, offsets 0..%llu, step %llu then 512, 15 s cap%s): %ld tried, %ld mapped, %ld refused (first refusal %d %s); ",
             d1.w, d1.h, (unsigned long long)msize[0], (unsigned long long)malign, capped ? ", STOPPED at the cap" : "", tried, mapped, refused, first_ref, cur(first_ref));
      if (exact_off != ~0ull) printf("chroma EXACT at offset %llu\n", exact_off);
      else if (best >= 0) printf("no exact offset; best offset %llu with %ld of %ld texels wrong\n", best_off, best, (long)d1.w * d1.h);
      else printf("nothing mapped\n");
      if (exact_off != ~0ull) SUM("%s route=plane1-scan plane=1: MAPS-EXACT at offset %llu (image memory size %llu)", tag, exact_off, (unsigned long long)msize[0]);
      else SUM("%s route=plane1-scan plane=1: NO-EXACT-OFFSET (%ld mapped, best %ld wrong at %llu%s)", tag, mapped, best, best_off, capped ? ", capped" : "");
    }
    // (b) the whole memory as ONE multi-planar CUDA array (NV12 / P010 / P016), planes via cuArrayGetPlane.
    for (int wi = 0; wi < f->nwhole; wi++) {
      static const int chans[3] = {3, 1, 2};
      CUmipmappedArray mm = 0; CUarray a = 0; CUresult r = CUDA_ERROR_INVALID_VALUE; int used = 0;
      for (int ci = 0; ci < 3; ci++) {
        r = map_array(cem[0], 0, W, H, f->whole[wi], chans[ci], &mm, &a);
        printf("    map whole-%s (format 0x%x, NumChannels %d, %dx%d @0, flags 0) = %d %s\n", f->whole_name[wi], (unsigned)f->whole[wi], chans[ci], W, H, r, cur(r));
        if (r == CUDA_SUCCESS) { used = chans[ci]; break; }
      }
      char route[96];
      if (r != CUDA_SUCCESS) {
        snprintf(route, sizeof route, "whole-%s", f->whole_name[wi]);
        SUM("%s route=%s: REFUSED %d %s (NumChannels 3, 1, 2 all tried)", tag, route, r, cur(r)); continue;
      }
      describe_array("whole array", a);
      for (int p = 0; p < 2; p++) {
        Dim d = p ? d1 : d0; CUarray pa = 0;
        snprintf(route, sizeof route, "whole-%s(ch%d)+cuArrayGetPlane plane=%d", f->whole_name[wi], used, p);
        CUresult rp = p_cuArrayGetPlane(&pa, a, (unsigned)p);
        printf("    cuArrayGetPlane(%d) = %d %s\n", p, rp, cur(rp));
        if (rp != CUDA_SUCCESS) { SUM("%s route=%s: GETPLANE-REFUSED %d %s", tag, route, rp, cur(rp)); continue; }
        describe_array(p ? "plane 1" : "plane 0", pa);
        check_array(tag, route, pa, d.w, d.h, f->pl[p].ch, f->bpc);
      }
      p_cuMipmappedArrayDestroy(mm);
    }
  }

out:
  if (p_cuCtxSynchronize) p_cuCtxSynchronize();
  for (int m = 0; m < 2; m++) { if (cem[m]) p_cuDestroyExternalMemory(cem[m]); if (fds[m] >= 0) close(fds[m]); }
  if (fence) vkDestroyFence(dev, fence, 0);
  if (cb) vkFreeCommandBuffers(dev, pool, 1, &cb);
  if (sbuf) vkDestroyBuffer(dev, sbuf, 0);
  if (rbuf) vkDestroyBuffer(dev, rbuf, 0);
  if (smem) vkFreeMemory(dev, smem, 0);
  if (rmem) vkFreeMemory(dev, rmem, 0);
  if (img) vkDestroyImage(dev, img, 0);
  for (int m = 0; m < 2; m++) if (mem[m]) vkFreeMemory(dev, mem[m], 0);
  fflush(stdout);
}

int main(int argc, char **argv) {
  setvbuf(stdout, 0, _IOLBF, 0);
  signal(SIGALRM, watchdog); alarm(300);
  int quick = argc > 1 && !strcmp(argv[1], "quick");
  printf("multiplanar probe: OPTIMAL multi-planar Vulkan image -> opaque fd -> CUDA array, texel-exact?\n");

  // Step 1: Vulkan instance + device.
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "multiplanar-probe", .apiVersion = VK_API_VERSION_1_2};
  VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
  VkResult r = vkCreateInstance(&ici, 0, &inst);
  if (r != VK_SUCCESS) { printf("FAIL vkCreateInstance = %d %s (no Vulkan driver? set VK_DRIVER_FILES to the NVIDIA ICD json)\n", r, vkr(r)); return 1; }
  uint32_t n = 0; VK(vkEnumeratePhysicalDevices(inst, &n, 0));
  if (!n) { printf("FAIL no Vulkan physical device\n"); return 1; }
  VkPhysicalDevice pds[16]; if (n > 16) n = 16; r = vkEnumeratePhysicalDevices(inst, &n, pds);
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) VK(r);
  pd = pds[0]; int found = 0;
  for (uint32_t i = 0; i < n; i++) {
    VkPhysicalDeviceProperties p; vkGetPhysicalDeviceProperties(pds[i], &p);
    printf("Vulkan physical device %u: %s vendor 0x%04x api %u.%u.%u\n", i, p.deviceName, p.vendorID,
           VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion), VK_API_VERSION_PATCH(p.apiVersion));
    if (p.vendorID == 0x10de && !found) { pd = pds[i]; found = 1; }
  }
  VkPhysicalDeviceIDProperties idp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
  VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, .pNext = &idp};
  VkPhysicalDeviceProperties2 pp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
  vkGetPhysicalDeviceProperties2(pd, &pp);
  printf("%s Vulkan device: %s, driver %s %s\n", found ? "PASS using NVIDIA" : "WARN no NVIDIA Vulkan device; using the first",
         pp.properties.deviceName, drv.driverName, drv.driverInfo);
  printf("  deviceUUID ");
  for (int i = 0; i < (int)VK_UUID_SIZE; i++) printf("%02x", idp.deviceUUID[i]);
  printf("\n");
  uint32_t ne = 0; VK(vkEnumerateDeviceExtensionProperties(pd, 0, &ne, 0));
  VkExtensionProperties *ep = calloc(ne ? ne : 1, sizeof *ep); VK(vkEnumerateDeviceExtensionProperties(pd, 0, &ne, ep));
  int has_memfd = 0;
  for (uint32_t i = 0; i < ne; i++) if (!strcmp(ep[i].extensionName, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME)) has_memfd = 1;
  free(ep);
  if (!has_memfd) { printf("FAIL the device lacks VK_KHR_external_memory_fd (not an NVIDIA device?)\n"); return 1; }
  VkPhysicalDeviceSamplerYcbcrConversionFeatures ycf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SAMPLER_YCBCR_CONVERSION_FEATURES};
  VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &ycf};
  vkGetPhysicalDeviceFeatures2(pd, &f2);
  printf("  samplerYcbcrConversion feature: %s\n", ycf.samplerYcbcrConversion ? "supported (enabling)" : "NOT supported");
  uint32_t nf = 0; vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, 0);
  VkQueueFamilyProperties qf[16]; if (nf > 16) nf = 16; vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, qf);
  int q = -1;
  for (uint32_t i = 0; i < nf && q < 0; i++) if (qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) q = (int)i;
  for (uint32_t i = 0; i < nf && q < 0; i++) if (qf[i].queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_TRANSFER_BIT)) q = (int)i;
  if (q < 0) { printf("FAIL no usable queue family\n"); return 1; }
  qfam = (uint32_t)q;
  float prio = 1;
  VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = qfam, .queueCount = 1, .pQueuePriorities = &prio};
  const char *exts[] = {VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME};
  VkPhysicalDeviceSamplerYcbcrConversionFeatures ycen = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SAMPLER_YCBCR_CONVERSION_FEATURES,
    .samplerYcbcrConversion = ycf.samplerYcbcrConversion};
  VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &ycen, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci,
    .enabledExtensionCount = 1, .ppEnabledExtensionNames = exts};
  VK(vkCreateDevice(pd, &dci, 0, &dev));
  vkGetDeviceQueue(dev, qfam, 0, &queue);
  getMemoryFd = (PFN_vkGetMemoryFdKHR)vkGetDeviceProcAddr(dev, "vkGetMemoryFdKHR");
  if (!getMemoryFd) { printf("FAIL vkGetMemoryFdKHR not found\n"); return 1; }
  vkGetPhysicalDeviceMemoryProperties(pd, &memprops);
  VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, .queueFamilyIndex = qfam};
  VK(vkCreateCommandPool(dev, &pci, 0, &pool));
  printf("PASS Vulkan device created (queue family %u, VK_KHR_external_memory_fd)\n", qfam);

  // CUDA: dlopen, match the device by UUID.
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) { printf("FAIL dlopen libcuda.so.1: %s (no NVIDIA driver on this machine?)\n", dlerror()); return 2; }
  cu_err_name = (CUresult (*)(CUresult, const char **))dlsym(lib, "cuGetErrorName");
  LOAD(cuInit, "cuInit"); LOAD(cuDriverGetVersion, "cuDriverGetVersion"); LOAD(cuDeviceGetCount, "cuDeviceGetCount");
  LOAD(cuDeviceGet, "cuDeviceGet"); LOAD(cuDeviceGetName, "cuDeviceGetName");
  p_cuDeviceGetUuid = (__typeof__(p_cuDeviceGetUuid))dlsym(lib, "cuDeviceGetUuid_v2");
  if (!p_cuDeviceGetUuid) LOAD(cuDeviceGetUuid, "cuDeviceGetUuid");
  LOAD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); LOAD(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  LOAD(cuCtxSetCurrent, "cuCtxSetCurrent"); LOAD(cuCtxSynchronize, "cuCtxSynchronize");
  LOAD(cuImportExternalMemory, "cuImportExternalMemory"); LOAD(cuDestroyExternalMemory, "cuDestroyExternalMemory");
  LOAD(cuExternalMemoryGetMappedMipmappedArray, "cuExternalMemoryGetMappedMipmappedArray");
  LOAD(cuMipmappedArrayGetLevel, "cuMipmappedArrayGetLevel"); LOAD(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy");
  LOAD(cuArrayGetPlane, "cuArrayGetPlane"); LOAD(cuArray3DGetDescriptor, "cuArray3DGetDescriptor_v2"); LOAD(cuMemcpy3D, "cuMemcpy3D_v2");
  {
    CUresult cr = p_cuInit(0);
    if (cr != CUDA_SUCCESS) { printf("FAIL cuInit = %d %s (no usable NVIDIA GPU for CUDA?)\n", cr, cur(cr)); return 2; }
  }
  int dv = 0; CU(p_cuDriverGetVersion(&dv));
  int ncu = 0; CU(p_cuDeviceGetCount(&ncu));
  printf("CUDA driver version %d, %d device(s)\n", dv, ncu);
  int match = -1;
  for (int i = 0; i < ncu; i++) {
    CUdevice d; CU(p_cuDeviceGet(&d, i)); char name[128] = {0}; CU(p_cuDeviceGetName(name, sizeof name, d));
    CUuuid u; CU(p_cuDeviceGetUuid(&u, d));
    printf("  CUDA device %d: %s uuid ", i, name);
    for (int k = 0; k < 16; k++) printf("%02x", (unsigned char)u.bytes[k]);
    int same = !memcmp(u.bytes, idp.deviceUUID, 16);
    printf("%s\n", same ? "  <- matches the Vulkan deviceUUID" : "");
    if (same && match < 0) { match = i; cudev = d; }
  }
  if (match < 0) { printf("FAIL no CUDA device has the Vulkan deviceUUID\n"); return 2; }
  CU(p_cuDevicePrimaryCtxRetain(&cuctx, cudev)); CU(p_cuCtxSetCurrent(cuctx));
  printf("PASS CUDA device %d matched by UUID, primary context current\n", match);

  // Step 2: capability queries.
  for (int fi = 0; fi < NFMT; fi++) query_format(&fmts[fi]);

  // Steps 3-6 per size and format; the disjoint variant runs first so its plane-0 size can seed plane1@guess.
  static const int sizes[2][2] = {{256, 128}, {1920, 1080}};
  for (int si = 0; si < (quick ? 1 : 2); si++) {
    int W = sizes[si][0], H = sizes[si][1];
    printf("\n==== size %dx%d\n", W, H);
    for (int fi = 0; fi < NFMT; fi++) {
      if (fmts[fi].nplanes == 2) {
        VkFormatProperties fp; vkGetPhysicalDeviceFormatProperties(pd, fmts[fi].vk, &fp);
        if (fp.optimalTilingFeatures & VK_FORMAT_FEATURE_DISJOINT_BIT) run_test(fi, si, W, H, 1);
        else { printf("\n-- fmt=%s size=%dx%d variant=disjoint: skipped, OPTIMAL lacks VK_FORMAT_FEATURE_DISJOINT_BIT\n", fmts[fi].name, W, H);
               SUM("fmt=%s size=%dx%d variant=disjoint: NOT-SUPPORTED (no DISJOINT format feature)", fmts[fi].name, W, H); }
      }
      run_test(fi, si, W, H, 0);
    }
  }

  // Step 7.
  printf("\n==== SUMMARY (MAPS-EXACT = CUDA array texels equal what Vulkan wrote; MAPS-EXACT-TOP10 = 10-bit values exact, low 6 bits differ)\n");
  for (int i = 0; i < nsum; i++) printf("SUMMARY %s\n", summary[i]);

  p_cuCtxSynchronize();
  p_cuDevicePrimaryCtxRelease(cudev);
  vkDestroyCommandPool(dev, pool, 0);
  vkDestroyDevice(dev, 0);
  vkDestroyInstance(inst, 0);
  printf("multiplanar probe: done\n");
  alarm(0);
  return 0;
}
