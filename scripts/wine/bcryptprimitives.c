/* Test-time stand-in for Windows' bcryptprimitives.dll under Wine 8, which lacks it.
 *
 * Rust's standard library imports ProcessPrng from bcryptprimitives.dll (Windows 10 and
 * later have it); Debian 12's Wine 8 does not, so no Rust test binary starts there. This
 * stub exports ProcessPrng over advapi32's RtlGenRandom (SystemFunction036), which Wine has.
 * scripts/wine/run builds it with mingw-w64 and puts it beside the test binary; it is never
 * shipped and never needed on a real Windows node. */
#include <windows.h>

typedef BOOLEAN(WINAPI *rtl_gen_random_fn)(PVOID, ULONG);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    static rtl_gen_random_fn gen;
    if (!gen) {
        HMODULE advapi = LoadLibraryA("advapi32.dll");
        if (!advapi)
            return FALSE;
        gen = (rtl_gen_random_fn)(void *)GetProcAddress(advapi, "SystemFunction036");
        if (!gen)
            return FALSE;
    }
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!gen(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
