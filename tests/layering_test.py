#!/usr/bin/python3
"""The include graph follows the library graph: every `#include "folder/..."` in app/, model/, data/
and parallel/ must name a folder whose CMake library the including folder links (directly or through
the libraries it links). The library graph is read from the folders' gpt_folder_library(... PUBLIC ...)
calls, so CMake stays the one description of the layering; this test fails, naming the file and line,
on an include that goes up or sideways (model/ including parallel/, comm/ including grid/, ...), and on
a circle in the library graph itself.

Usage: layering_test.py SOURCE_DIR
"""
import os
import re
import sys

SOURCE_SUFFIXES = ('.h', '.cpp', '.cu', '.cuh')
TOP_FOLDERS = ('app', 'model', 'data', 'parallel')


def folder_of(path):
    """'parallel/grid/x.h' -> 'parallel/grid'; 'model/ops/cpu/y.h' -> 'model'; None outside the tree."""
    parts = path.split('/')
    if parts[0] == 'parallel' and len(parts) > 2:
        return '/'.join(parts[:2])
    return parts[0] if parts[0] in TOP_FOLDERS and len(parts) > 1 else None


def library_of(folder):
    return 'gpt_' + folder.split('/')[-1]


def read_library_graph(root):
    """{library: [libraries it links PUBLIC]} from every gpt_folder_library call under the folders."""
    graph = {}
    call = re.compile(r'gpt_folder_library\(\s*(\w+)(.*?)\)', re.S)
    for top in TOP_FOLDERS:
        for d, _, files in os.walk(os.path.join(root, top)):
            if 'CMakeLists.txt' not in files:
                continue
            text = re.sub(r'#.*', '', open(os.path.join(d, 'CMakeLists.txt')).read())
            for name, args in call.findall(text):
                words = args.split()
                deps, public = [], False
                for w in words:
                    if w in ('PUBLIC', 'PRIVATE', 'SUBDIRS', 'EXCLUDE'):
                        public = w == 'PUBLIC'
                    elif public and w.startswith('gpt_'):
                        deps.append(w)
                graph[name] = deps
    return graph


def reachable(graph, start):
    seen, todo = set(), list(graph.get(start, []))
    while todo:
        lib = todo.pop()
        if lib not in seen:
            seen.add(lib)
            todo.extend(graph.get(lib, []))
    return seen


def main():
    root = sys.argv[1]
    graph = read_library_graph(root)
    errors = []
    expected = {'gpt_model', 'gpt_data', 'gpt_comm', 'gpt_grid', 'gpt_pipeline', 'gpt_data_parallel',
                'gpt_checkpoint', 'gpt_plan', 'gpt_app'}
    if set(graph) != expected:
        errors.append(f'folder libraries found: {sorted(graph)}, expected {sorted(expected)}')
    for lib in graph:
        if lib in reachable(graph, lib):
            errors.append(f'{lib} links itself through {graph[lib]}: a circle in the library graph')
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    checked = 0
    for top in TOP_FOLDERS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(d, f), root)
                src = folder_of(path)
                allowed = reachable(graph, library_of(src)) | {library_of(src)}
                for n, line in enumerate(open(os.path.join(root, path)), 1):
                    m = include.match(line)
                    if not m or folder_of(m.group(1)) is None:
                        continue
                    checked += 1
                    dst = folder_of(m.group(1))
                    if library_of(dst) not in allowed:
                        errors.append(f'{path}:{n}: includes {m.group(1)}, but {library_of(src)} ({src}/) '
                                      f'does not link {library_of(dst)} ({dst}/)')
    if checked < 100:
        errors.append(f'only {checked} project includes found under {root}: wrong source directory?')
    for e in errors:
        print(e)
    print(f'{checked} includes checked against {len(graph)} folder libraries: '
          f'{"OK" if not errors else f"{len(errors)} problem(s)"}')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
