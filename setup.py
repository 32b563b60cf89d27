"""The optional C accelerator: crop-window JPEG decoding against libjpeg-turbo (``transforms/_jpeg_window.c``).

Everything else about the package is in pyproject.toml. The extension is optional, as PyYAML treats libyaml:
where a C compiler or libjpeg's headers are missing (Debian/Ubuntu: ``apt install libjpeg-dev``; Fedora:
``dnf install libjpeg-turbo-devel``; macOS: ``brew install jpeg-turbo``), the build goes on without it and
feedline decodes whole JPEGs through torchvision, saying so once at start-up. ``FEEDLINE_JPEG_INCLUDE`` and
``FEEDLINE_JPEG_LIB`` point the build at a libjpeg-turbo installed elsewhere.
"""

import os

from setuptools import Extension, setup


def _dirs(name: str) -> list[str]:
    value = os.environ.get(name, "")
    return [d for d in value.split(os.pathsep) if d]


setup(
    ext_modules=[
        Extension(
            "feedline.transforms._jpeg_window",
            ["transforms/_jpeg_window.c"],
            libraries=["jpeg"],
            include_dirs=_dirs("FEEDLINE_JPEG_INCLUDE"),
            library_dirs=_dirs("FEEDLINE_JPEG_LIB"),
            runtime_library_dirs=_dirs("FEEDLINE_JPEG_LIB"),
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
