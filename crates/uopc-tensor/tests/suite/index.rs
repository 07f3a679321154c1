//! arange, one_hot and index_select against direct host computations, with the gradient of a
//! selection (an embedding lookup) against its scatter-add.

use uopc_ir::DType;
use uopc_tensor::*;

#[test]
fn arange_counts_from_zero() {
    let r = Tensor::arange(5).to_ndarray::<i64>().unwrap();
    assert_eq!(r.as_slice(), Some(&[0i64, 1, 2, 3, 4][..]));
    assert_eq!(Tensor::arange(0).shape(), &[0]);
}

#[test]
fn one_hot_rows_and_errors() {
    let h = Tensor::try_one_hot(&[1, 1, 0], 2).unwrap().to_ndarray::<f32>().unwrap();
    assert_eq!(h.as_slice(), Some(&[0.0, 1.0, 0.0, 1.0, 1.0, 0.0][..]));
    let e = Tensor::try_one_hot(&[0, 5], 4).unwrap_err().to_string();
    assert!(e.starts_with("one_hot: ") && e.contains("indices[1] = 5"), "{e}");
}

#[test]
fn index_select_picks_rows_exactly_in_f32_and_f64() {
    let (rows, width) = (7, 5);
    let data: Vec<f64> = (0..rows * width).map(|i| (i as f64 * 0.37).sin() * 1e3).collect();
    let idx = [6, 0, 3, 3, 1];
    for dtype in [DType::F32, DType::F64] {
        let table = Tensor::from_vec(data.clone(), &[rows, width]).cast(dtype);
        let got = table.try_index_select_rows(&idx).unwrap().cast(DType::F64).to_ndarray::<f64>().unwrap();
        assert_eq!(got.shape(), &[idx.len(), width]);
        for (r, &i) in idx.iter().enumerate() {
            for c in 0..width {
                let want =
                    if dtype == DType::F32 { data[i * width + c] as f32 as f64 } else { data[i * width + c] };
                // a copy: exact
                assert_eq!(got[[r, c]], want, "{dtype:?} row {r} col {c}");
            }
        }
    }
    // Higher-rank rows keep their trailing shape; no indices give no rows.
    let cube = Tensor::full(&[3, 2, 4], 1.5);
    assert_eq!(cube.try_index_select_rows(&[2, 0]).unwrap().shape(), &[2, 2, 4]);
    assert_eq!(cube.try_index_select_rows(&[]).unwrap().shape(), &[0, 2, 4]);
}

#[test]
fn index_select_errors_name_the_argument() {
    let t = Tensor::full(&[3, 2], 1.0);
    let e = t.try_index_select_rows(&[0, 3]).unwrap_err().to_string();
    assert!(e.starts_with("index_select_rows: ") && e.contains("indices[1] = 3"), "{e}");
    let e = Tensor::scalar(1.0).try_index_select_rows(&[0]).unwrap_err().to_string();
    assert!(e.starts_with("index_select_rows: ") && e.contains("0-d"), "{e}");
    // Integer rows are copied too.
    let picked = Tensor::arange(3).try_index_select_rows(&[2, 0]).unwrap();
    assert_eq!(picked.to_ndarray::<i64>().unwrap().as_slice(), Some(&[2i64, 0][..]));
}

#[test]
fn the_gradient_of_a_selection_is_the_scatter_add_of_its_rows() {
    let (rows, width) = (4, 3);
    let table =
        Tensor::from_vec((0..rows * width).map(|i| i as f32 * 0.25).collect::<Vec<f32>>(), &[rows, width]);
    let idx = [2, 0, 2, 3];
    let w: Vec<f32> = (0..idx.len() * width).map(|i| (i as f32 * 0.7).cos()).collect();
    let picked = table.try_index_select_rows(&idx).unwrap();
    let loss = (&picked * &Tensor::from_vec(w.clone(), &[idx.len(), width]))
        .reshape(&[idx.len() * width])
        .sum(0, false);
    let g = gradient(&loss, &[&table]).unwrap().remove(0).to_ndarray::<f32>().unwrap();
    let mut want = vec![0.0f64; rows * width];
    for (r, &i) in idx.iter().enumerate() {
        for c in 0..width {
            want[i * width + c] += f64::from(w[r * width + c]);
        }
    }
    for (got, want) in g.iter().zip(&want) {
        // row 2 sums two f32 cotangents: one rounding
        assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
    }
}
