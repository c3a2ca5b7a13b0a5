"""openforge-mind2web: Online-Mind2Web tasks in a browser, judged WebJudge-style."""
