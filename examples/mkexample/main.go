// Command mkexample writes examples/skus.xlsx, the bundled example sheet that
// `make run` processes: product rows with Chinese headers, prices as numbers
// with a number format, listing dates, a styled and frozen header row, and a
// "prompt" sheet holding the template, as an operations team would upload it.
// The result of `make run` is this workbook with the answers beside the rows.
package main

import (
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/xuri/excelize/v2"
)

func main() {
	out := flag.String("out", "examples/skus.xlsx", "output path")
	rows := flag.Int("rows", 200, "number of product rows")
	flag.Parse()
	if err := write(*out, *rows); err != nil {
		log.Fatal(err)
	}
}

func write(path string, n int) error {
	f := excelize.NewFile()
	defer f.Close()
	const sheet = "商品"
	if err := f.SetSheetName("Sheet1", sheet); err != nil {
		return err
	}
	products := []string{"保温杯", "蓝牙耳机", "机械键盘", "瑜伽垫", "电动牙刷", "双肩包", "咖啡豆", "台灯", "跑步鞋", "空气炸锅"}
	categories := []string{"家居", "数码", "数码", "运动", "个护", "箱包", "食品", "家居", "运动", "厨电"}
	colors := []string{"白色", "黑色", "灰色", "蓝色", "红色"}
	if err := f.SetSheetRow(sheet, "A1", &[]any{"SKU", "商品名称", "类目", "颜色", "价格", "上架日期"}); err != nil {
		return err
	}
	header, err := f.NewStyle(&excelize.Style{Font: &excelize.Font{Bold: true}, Fill: excelize.Fill{Type: "pattern", Pattern: 1, Color: []string{"DDEBF7"}}})
	if err != nil {
		return err
	}
	price, err := f.NewStyle(&excelize.Style{NumFmt: 4}) // #,##0.00
	if err != nil {
		return err
	}
	date, err := f.NewStyle(&excelize.Style{NumFmt: 14}) // Excel's short date, read as 2024/1/15
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		p := i % len(products)
		row := []any{
			fmt.Sprintf("SKU-%05d", i+1),
			fmt.Sprintf("%s %d代", products[p], i/len(products)+1),
			categories[p],
			colors[i%len(colors)],
			19.9 + float64(i%37)*7.5,
			time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, i%180),
		}
		cell, _ := excelize.CoordinatesToCellName(1, i+2)
		if err := f.SetSheetRow(sheet, cell, &row); err != nil {
			return err
		}
	}
	last := fmt.Sprint(n + 1)
	for _, s := range []struct {
		from, to string
		style    int
	}{{"A1", "F1", header}, {"E2", "E" + last, price}, {"F2", "F" + last, date}} {
		if err := f.SetCellStyle(sheet, s.from, s.to, s.style); err != nil {
			return err
		}
	}
	if err := f.SetColWidth(sheet, "A", "F", 14); err != nil {
		return err
	}
	if err := f.SetPanes(sheet, &excelize.Panes{Freeze: true, YSplit: 1, TopLeftCell: "A2", ActivePane: "bottomLeft"}); err != nil {
		return err
	}
	if _, err := f.NewSheet("prompt"); err != nil {
		return err
	}
	if err := f.SetCellStr("prompt", "A1", "为商品{{商品名称}}（类目：{{类目}}，颜色：{{颜色}}，售价 {{价格}} 元）写一段 50 字以内的营销文案"); err != nil {
		return err
	}
	return f.SaveAs(path)
}
