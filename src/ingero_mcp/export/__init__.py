"""Pictures of a trace: a Perfetto / Chrome timeline (`perfetto`, `chrome_json`) and a self-contained HTML report
(`html`)."""
