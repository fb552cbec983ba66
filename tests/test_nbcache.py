"""book.nbcache: nbval's outputs become an executed notebook the book build can take from its cache (the build)."""
import nbformat

from book.nbcache import executed_notebook


def _nb(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("print(1)"),
                nbformat.v4.new_code_cell("2")]
    p = tmp_path / "t.ipynb"
    nbformat.write(nb, p)
    return str(p)


def test_outputs_land_in_their_cells_numbered_from_one(tmp_path):
    outs = {0: [{"output_type": "stream", "name": "stdout", "text": "1\n"}],
            1: [{"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {}}]}
    nb = executed_notebook(_nb(tmp_path), outs)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2]
    assert code[0].outputs[0].text == "1\n" and code[1].outputs[0].execution_count == 2


def test_a_cell_without_outputs_recorded_means_no_notebook(tmp_path):
    assert executed_notebook(_nb(tmp_path), {0: []}) is None
