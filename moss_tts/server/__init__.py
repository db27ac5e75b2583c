"""The speech server (`python -m moss_tts serve`): an OpenAI-style API and a browser page over
loaded TTS models. app.py holds the routes and `create_app`; see its docstring for the rest."""

from .app import create_app
from .settings import ServerSettings

__all__ = ["create_app", "ServerSettings"]
