"""The stylesheet shared by the report page and the edit cards (both self-contained HTML)."""

CSS = """body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222}.wrap{overflow-x:auto;max-width:100%;margin:.5em 0 1.5em}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;
white-space:nowrap}thead th{background:#f3f3f3;white-space:normal;text-align:center}
tbody th{text-align:left;white-space:normal}td .d{display:block;font-size:11px;color:#555}
figure{margin:1em 0 2em}img{max-width:100%}figcaption,.protocol{font-size:13px;color:#555}
code{background:#f5f5f5;padding:0 3px}pre{white-space:pre-wrap;overflow-wrap:anywhere}
.meta td,.meta th{text-align:left;white-space:normal;overflow-wrap:anywhere}"""
