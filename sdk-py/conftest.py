# pytest only. The template is a project of its own: its tests run in a copy of it made by
# scripts/test-policies-py.sh, with bindings of its own.
collect_ignore = ["template"]
