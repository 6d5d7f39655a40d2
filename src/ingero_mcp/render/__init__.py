"""Terminal rendering with rich, shared by the commands: number formats, safe traced strings, report views."""
