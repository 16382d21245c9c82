"""AMX detection picks the settings that avoid llama.cpp's AMX batched-prefill crash (docs/architecture.md)."""

from chatphase.system.cpu_features import detect_amx, read_cpu_flags


def test_detects_amx_from_llama_system_info():
    assert detect_amx("CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert not detect_amx("CPU : AVX512 = 1 | AVX512_BF16 = 1 | REPACK = 1 |")
    assert not detect_amx("CPU : AMX_INT8 = 0 |")


def test_detects_amx_from_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile amx_int8\n")
    flags = read_cpu_flags(cpuinfo)
    assert "amx_tile" in flags
    assert detect_amx("CPU : AVX2 = 1 |", flags)
    assert read_cpu_flags(tmp_path / "missing") == frozenset()
