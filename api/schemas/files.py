"""OpenAI's file objects (openai.types.FileObject, FileDeleted) and their list page."""

from openai.types import FileDeleted, FileObject

from api.schemas.common import OpenAIList


class FileList(OpenAIList[FileObject]):
    """A page of the tenant's uploads."""

__all__ = ["FileDeleted", "FileList", "FileObject"]
