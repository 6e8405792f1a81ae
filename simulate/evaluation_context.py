"""What the renderers of `edgegrove bench report` share: the loaded documents, where the images
go, and matplotlib, imported only when a plot is drawn."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Context:
    """What renderers share: every loaded document, where images go, what was drawn."""

    docs: dict[str, dict[str, Any]]
    img_dir: Path
    img_prefix: str
    images: list[Path] = field(default_factory=list)

    def image(self, name: str, draw: Callable[[Path], None], alt: str) -> str:
        """Draw a plot into img_dir/name; the markdown that embeds it (or why it is absent)."""
        path = self.img_dir / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            draw(path)
        except ModuleNotFoundError:
            return f"_(plot {name} not drawn: matplotlib is not installed)_"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"_(plot {name} not drawn: {exc})_"
        self.images.append(path)
        return f"![{alt}]({self.img_prefix}{name})"


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
